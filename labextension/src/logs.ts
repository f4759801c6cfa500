/**
 * A job's logs in the main area: the tail of one process's log (the master's first),
 * with the role and index to read, a refresh button, and "follow", which refreshes
 * while the tab is visible.
 *
 * DOM hooks: `.edl-logs[data-job-name]`, `select.edl-logs-role`, `input.edl-logs-index`,
 * `button[data-action=refresh-logs]`, `input.edl-logs-follow`, `pre.edl-logs-text`.
 */
import { MainAreaWidget } from '@jupyterlab/apputils';
import { refreshIcon } from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { ApiError, JobsClient, LogRole, UnreachableError } from './api';
import { elasticdlIcon } from './icon';
import { intervalMs } from './panel';
import { Ticker } from './ticker';

/** Lines of log shown. */
export const LOG_TAIL = 500;

const ROLES: LogRole[] = ['master', 'worker', 'ps'];

/** The content: the controls and the text. */
export class LogsView extends Widget {
  constructor(
    readonly jobName: string,
    private readonly client: JobsClient,
    refreshInterval: number
  ) {
    super();
    this.addClass('edl-logs');
    this.node.dataset.jobName = jobName;

    const controls = document.createElement('div');
    controls.className = 'edl-logs-controls';

    this._role = document.createElement('select');
    this._role.className = 'edl-logs-role';
    this._role.setAttribute('aria-label', 'role');
    for (const role of ROLES) {
      this._role.append(new Option(role, role));
    }
    this._index = document.createElement('input');
    this._index.className = 'edl-logs-index';
    this._index.type = 'number';
    this._index.min = '0';
    this._index.value = '0';
    this._index.setAttribute('aria-label', 'index');
    this._index.disabled = true; // the master has only index 0

    const refresh = document.createElement('button');
    refresh.className = 'edl-button';
    refresh.type = 'button';
    refresh.dataset.action = 'refresh-logs';
    refresh.title = 'Refresh the log';
    refresh.append(refreshIcon.element({ tag: 'span' }), ' Refresh');

    const followLabel = document.createElement('label');
    followLabel.className = 'edl-logs-follow-label';
    this._follow = document.createElement('input');
    this._follow.type = 'checkbox';
    this._follow.className = 'edl-logs-follow';
    this._follow.checked = true;
    followLabel.append(this._follow, ' follow');

    this._problem = document.createElement('span');
    this._problem.className = 'edl-logs-problem';

    controls.append(
      labelled('role', this._role),
      labelled('index', this._index),
      refresh,
      followLabel,
      this._problem
    );

    this._text = document.createElement('pre');
    this._text.className = 'edl-logs-text';
    this.node.append(controls, this._text);

    this._role.onchange = () => {
      this._index.disabled = this._role.value === 'master';
      if (this._index.disabled) {
        this._index.value = '0';
      }
      void this.load();
    };
    this._index.onchange = () => void this.load();
    refresh.onclick = () => void this.load();
    this._follow.onchange = () => this._ticker.now();

    // "follow": reload while visible; the controls above load at once regardless.
    this._ticker = new Ticker({
      call: async () => {
        if (!(await this.load())) {
          throw new UnreachableError(); // back off
        }
      },
      interval: intervalMs(refreshInterval),
      max: 30_000,
      standby: () => !this.isVisible || document.hidden || !this._follow.checked
    });
  }

  /**
   * Read the chosen log now; keeps the view scrolled to the end if it was there.
   * Resolves false if the server could not be reached (the view says so).
   */
  async load(): Promise<boolean> {
    const role = this._role.value as LogRole;
    const index = Math.max(0, Math.floor(Number(this._index.value) || 0));
    try {
      const logs = await this.client.logs(this.jobName, role, index, LOG_TAIL);
      const atEnd =
        this._text.scrollTop + this._text.clientHeight >=
        this._text.scrollHeight - 4;
      if (this._text.textContent !== logs.text) {
        this._text.textContent = logs.text || '(empty)';
        if (atEnd) {
          this._text.scrollTop = this._text.scrollHeight;
        }
      }
      this._problem.textContent = '';
    } catch (error) {
      if (error instanceof UnreachableError) {
        this._problem.textContent = 'Server unreachable, retrying…';
        return false;
      }
      this._problem.textContent = '';
      // No such log (a worker index that never ran, say): say so in place of the text.
      this._text.textContent =
        error instanceof ApiError ? error.message : String(error);
    }
    return true;
  }

  dispose(): void {
    if (!this.isDisposed) {
      this._ticker.dispose();
      super.dispose();
    }
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this._ticker.start();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._ticker.now();
  }

  private readonly _role: HTMLSelectElement;
  private readonly _index: HTMLInputElement;
  private readonly _follow: HTMLInputElement;
  private readonly _problem: HTMLSpanElement;
  private readonly _text: HTMLPreElement;
  private readonly _ticker: Ticker;
}

/** The main-area tab holding a `LogsView`. */
export function createLogsWidget(
  jobName: string,
  client: JobsClient,
  refreshInterval: number
): MainAreaWidget<LogsView> {
  const content = new LogsView(jobName, client, refreshInterval);
  const widget = new MainAreaWidget({ content });
  widget.id = `elasticdl-nb-logs-${jobName}`;
  widget.title.label = `${jobName} logs`;
  widget.title.icon = elasticdlIcon;
  widget.title.closable = true;
  return widget;
}

function labelled(text: string, control: HTMLElement): HTMLLabelElement {
  const label = document.createElement('label');
  label.className = 'edl-logs-field';
  label.append(`${text} `, control);
  return label;
}
