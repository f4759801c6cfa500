/**
 * The "ElasticDL" sidebar: the jobs, refreshed every `refreshInterval` seconds while
 * the sidebar is visible.
 *
 * When the server does not answer (stopped, restarting) the list stays as it was, one
 * quiet line says so, and the refreshes back off (2, 4, 8... times the interval apart,
 * at most `MAX_BACKOFF_MS`) until the server is back; then the line goes away and the
 * list is current again.
 */
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import {
  ApiError,
  IJobList,
  IJobSummary,
  JobState,
  JobsClient,
  UnreachableError
} from './api';
import { elasticdlIcon } from './icon';
import { IJobActions, JobRow } from './jobRow';
import { Ticker } from './ticker';

/** Refreshes never back off further apart than this while the server is away. */
export const MAX_BACKOFF_MS = 10_000;

export namespace JobsPanel {
  export interface IOptions {
    client: JobsClient;
    /** What a row's buttons do (see `IJobActions`). */
    actions: IJobActions;
    /** Seconds between refreshes. */
    refreshInterval: number;
    /** Also list the Kubernetes jobs of this namespace; '' for none. */
    namespace: string;
  }
}

export class JobsPanel extends Widget {
  constructor(options: JobsPanel.IOptions) {
    super();
    this.id = 'elasticdl-nb-sidebar';
    this.addClass('edl-sidebar');
    this.title.icon = elasticdlIcon;
    this.title.caption = 'ElasticDL jobs';
    this._client = options.client;
    this._actions = options.actions;
    this._namespace = options.namespace;

    const header = document.createElement('header');
    header.className = 'edl-sidebar-header';
    const icon = elasticdlIcon.element({
      className: 'edl-sidebar-icon',
      tag: 'span'
    });
    const title = document.createElement('h2');
    title.className = 'edl-sidebar-title';
    title.textContent = 'ElasticDL';
    header.append(icon, title);

    this._status = document.createElement('div');
    this._status.className = 'edl-status';
    this._status.setAttribute('role', 'status');
    this._status.hidden = true;

    this._empty = document.createElement('p');
    this._empty.className = 'edl-empty';
    this._empty.textContent =
      'No jobs yet. Start one from a notebook: %%elasticdl train, or edl.train(...).';
    this._empty.hidden = true;

    this._list = document.createElement('ul');
    this._list.className = 'edl-jobs';

    this.node.append(header, this._status, this._empty, this._list);

    this._ticker = new Ticker({
      call: () => this.refresh(),
      interval: intervalMs(options.refreshInterval),
      max: MAX_BACKOFF_MS,
      // Nothing to refresh while the sidebar is collapsed or the browser tab hidden.
      standby: () => !this.isVisible || document.hidden
    });
  }

  /** Change the refresh interval (seconds) and the namespace listed. */
  configure(refreshInterval: number, namespace: string): void {
    this._ticker.setInterval(intervalMs(refreshInterval), MAX_BACKOFF_MS);
    if (namespace !== this._namespace) {
      this._namespace = namespace;
      this._ticker.now();
    }
  }

  /** Fetch the list now and show it; rejects when the server could not be asked. */
  async refresh(): Promise<void> {
    let list: IJobList;
    try {
      list = await this._client.listJobs(this._namespace);
    } catch (error) {
      this._showProblem(error as Error);
      throw error; // the ticker backs off
    }
    this._showProblem(null);
    this._finalStates = new Set(list.final_states);
    this._render(list.jobs);
  }

  /** Whether nothing about a job in `state` changes any more, as the API last said. */
  isFinal(state: JobState): boolean {
    return this._finalStates.has(state);
  }

  /** Refresh soon (after an action changed a job). */
  refreshSoon(): void {
    this._ticker.now();
  }

  /** The row of job `name`, if listed. */
  row(name: string): JobRow | undefined {
    return this._rows.get(name);
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._ticker.dispose();
    super.dispose();
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this._ticker.start();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._ticker.now(); // at once, not at the next tick
  }

  /** Newest first; rows are kept (and updated) across refreshes. */
  private _render(jobs: IJobSummary[]): void {
    const now = Date.now() / 1000;
    const sorted = [...jobs].sort(
      (a, b) => (b.created ?? 0) - (a.created ?? 0)
    );
    const seen = new Set<string>();
    sorted.forEach((job, index) => {
      seen.add(job.name);
      let row = this._rows.get(job.name);
      if (row) {
        row.update(job, now);
      } else {
        row = new JobRow(job, this._actions, state => this.isFinal(state));
        this._rows.set(job.name, row);
      }
      if (this._list.children[index] !== row.node) {
        this._list.insertBefore(row.node, this._list.children[index] ?? null);
      }
    });
    for (const [name, row] of this._rows) {
      if (!seen.has(name)) {
        row.node.remove();
        this._rows.delete(name);
      }
    }
    this._empty.hidden = jobs.length > 0;
  }

  /** One quiet line about what went wrong, or none. */
  private _showProblem(error: Error | null): void {
    let text = '';
    if (error instanceof UnreachableError) {
      text = 'Server unreachable, retrying…';
    } else if (error instanceof ApiError) {
      text =
        error.status === 403
          ? 'Not allowed to list the jobs (logged out?), retrying…'
          : `Could not list the jobs: ${error.message}. Retrying…`;
    } else if (error) {
      text = `Could not list the jobs: ${error.message}. Retrying…`;
    }
    this._status.textContent = text;
    this._status.hidden = !text;
    this.node.classList.toggle('edl-mod-stale', !!text);
  }

  private readonly _client: JobsClient;
  private readonly _actions: IJobActions;
  private _namespace: string;
  /** Empty until the first list arrives (and with it the first rows). */
  private _finalStates: ReadonlySet<JobState> = new Set();
  private readonly _ticker: Ticker;
  private readonly _rows = new Map<string, JobRow>();
  private readonly _status: HTMLDivElement;
  private readonly _empty: HTMLParagraphElement;
  private readonly _list: HTMLUListElement;
}

/** `seconds` (the setting, at least 0.5) in milliseconds. */
export function intervalMs(seconds: number): number {
  return Math.max(0.5, Number(seconds) || 2) * 1000;
}
