/**
 * One job in the sidebar: name, state, progress bar, live/desired workers (and a range's
 * MIN:MAX), pending workers and why they wait, what the throughput policy does, PS
 * count, age, goodput and master restarts, with its controls (scale, logs, attach, stop).
 *
 * A row is built once per job and updated in place at every refresh, so that a number
 * being typed into the workers field, or the keyboard focus, survives the refresh.
 *
 * DOM hooks for tests and styles:
 *
 *     li.edl-job[data-job-name][data-state]
 *       .edl-job-state[data-state]   .edl-progress[role=progressbar][aria-valuenow: 0..100]
 *       .edl-job-workers[data-live][data-desired][data-min: 0 = no range]
 *       .edl-job-pending[data-pending]   .edl-job-ps   .edl-job-age
 *       .edl-job-goodput[data-goodput: 0..1]   .edl-job-restarts[data-restarts]
 *       .edl-job-pending-reason   .edl-job-workers-waiting[role=status]
 *       .edl-job-growth[role=status]   .edl-job-message
 *       button[data-action=scale-down|scale-up|scale-apply|logs|attach|stop]
 *       input.edl-workers-input
 */
import { IJobSummary, JobState } from './api';

/** What the row's buttons do; the panel provides it. */
export interface IJobActions {
  /** Ask for `workers` workers. */
  scale(job: IJobSummary, workers: number | string): Promise<void>;
  /** Stop the job (after asking the user). */
  stop(job: IJobSummary): Promise<void>;
  /** Open the job's logs in the main area. */
  openLogs(job: IJobSummary): void;
  /** Insert `%elasticdl attach NAME` into the active notebook. */
  attach(job: IJobSummary): void;
}

export class JobRow {
  /** The row's element, an `li.edl-job`. */
  readonly node: HTMLLIElement;

  /**
   * @param isFinal - whether nothing about a job in a state changes any more, as the
   *   API says (its list's `final_states`): such a job's controls are disabled.
   */
  constructor(
    job: IJobSummary,
    private readonly actions: IJobActions,
    private readonly isFinal: (state: JobState) => boolean
  ) {
    this._job = job;
    this.node = element('li', 'edl-job');
    this.node.dataset.jobName = job.name;

    const header = element('div', 'edl-job-header');
    this._name = element('span', 'edl-job-name', job.name);
    this._name.title = job.name;
    this._backend = element('span', 'edl-job-backend');
    this._state = element('span', 'edl-job-state');
    header.append(this._name, this._backend, this._state);

    this._progress = element('div', 'edl-progress');
    this._progress.setAttribute('role', 'progressbar');
    this._progress.setAttribute('aria-valuemin', '0');
    this._progress.setAttribute('aria-valuemax', '100');
    this._progress.setAttribute('aria-label', `${job.name} progress`);
    this._fill = element('div', 'edl-progress-fill');
    this._progress.append(this._fill);

    const facts = element('div', 'edl-job-facts');
    this._epoch = element('span', 'edl-job-epoch');
    this._workers = element('span', 'edl-job-workers');
    this._pending = element('span', 'edl-job-pending');
    this._ps = element('span', 'edl-job-ps');
    this._age = element('span', 'edl-job-age');
    this._goodput = element('span', 'edl-job-goodput');
    this._goodput.title =
      'goodput: worker time spent training over the worker time wanted';
    this._restarts = element('span', 'edl-job-restarts');
    this._restarts.title = 'the job went on after its master died';
    this._saturated = element('span', 'edl-job-saturated');
    this._saturated.title =
      'the master cannot keep up with its workers: they wait their turn (the job log says more)';
    this._saturated.textContent = 'master saturated';
    facts.append(
      this._epoch,
      this._workers,
      this._pending,
      this._ps,
      this._age,
      this._goodput,
      this._restarts,
      this._saturated
    );

    // Why the newest pending worker waits (the scheduler's words), why training
    // waits for workers (a range job below its MIN), and what the throughput policy
    // does ("holding at 3: the 4th added 2%"): each a line of its own.
    this._pendingReason = element('div', 'edl-job-pending-reason');
    this._workersWaiting = element('div', 'edl-job-workers-waiting');
    this._workersWaiting.setAttribute('role', 'status');
    this._growth = element('div', 'edl-job-growth');
    this._growth.setAttribute('role', 'status');
    this._growth.title =
      'the throughput policy: it grows the range one worker at a time while the ' +
      'newest adds enough samples/s';
    this._message = element('div', 'edl-job-message');

    const controls = element('div', 'edl-job-actions');
    this._scaleGroup = element('span', 'edl-scale');
    this._down = button('scale-down', '−', 'One worker fewer');
    this._input = element('input', 'edl-workers-input');
    this._input.type = 'number';
    this._input.min = '0';
    this._input.step = '1';
    this._input.setAttribute('aria-label', `workers of ${job.name}`);
    this._up = button('scale-up', '+', 'One worker more');
    this._apply = button('scale-apply', 'Scale', 'Scale to this many workers');
    this._scaleGroup.append(this._down, this._input, this._up, this._apply);
    this._logs = button('logs', 'Logs', 'Open the logs');
    this._attach = button(
      'attach',
      'Attach',
      'Insert %elasticdl attach into the active notebook'
    );
    this._stop = button('stop', 'Stop', 'Stop the job');
    this._stop.classList.add('edl-danger');
    const buttons = element('span', 'edl-job-buttons');
    buttons.append(this._logs, this._attach, this._stop);
    controls.append(this._scaleGroup, buttons);

    this.node.append(
      header,
      this._progress,
      facts,
      this._pendingReason,
      this._workersWaiting,
      this._growth,
      this._message,
      controls
    );
    this._wire();
    this.update(job);
  }

  /** The job as last shown. */
  get job(): IJobSummary {
    return this._job;
  }

  /** Show `job`'s new summary; `now` is in Unix seconds (for the age). */
  update(job: IJobSummary, now = Date.now() / 1000): void {
    this._job = job;
    const state = job.state || 'unknown';
    this.node.dataset.state = state;
    this.node.classList.toggle('edl-remote', !!job.remote);
    this._state.textContent = state;
    this._state.dataset.state = state;
    this._state.className = `edl-job-state edl-state-${state}`;
    this._backend.textContent = job.backend === 'kubernetes' ? 'k8s' : '';
    this._backend.title = job.backend === 'kubernetes' ? 'Kubernetes' : '';

    const progress = job.progress;
    const percent =
      Math.round(Math.min(1, Math.max(0, progress?.fraction ?? 0)) * 1000) / 10;
    this._progress.setAttribute('aria-valuenow', String(percent));
    this._progress.title = `${percent}% done`;
    this._fill.style.width = `${percent}%`;
    this._epoch.textContent = progress?.epochs
      ? `epoch ${Math.min(progress.epoch + 1, progress.epochs)}/${progress.epochs}` +
        (progress.records_per_second > 0 && state === 'running'
          ? ` · ${Math.round(progress.records_per_second)} rec/s`
          : '')
      : '';

    const workers = job.workers;
    const live = workers?.live ?? 0;
    const desired = workers?.desired ?? 0;
    const min = workers?.min ?? 0;
    this._workers.dataset.live = String(live);
    this._workers.dataset.desired = String(desired);
    this._workers.dataset.min = String(min);
    this._workers.textContent = workers
      ? `workers ${live}/${desired}` + (min > 0 ? ` (${min}:${desired})` : '')
      : '';
    this._workers.title =
      min > 0
        ? `live / desired workers; the range ${min}:${desired}: ` +
          `trains with ${min} or more, up to ${desired}`
        : 'live / desired workers';
    // Pending workers, waiting for them and the growth policy mean nothing once the
    // job is over.
    const over = this.isFinal(state);
    const pending = over ? 0 : (workers?.pending ?? 0);
    const reason = pending > 0 ? (workers?.pending_reason ?? '') : '';
    this._pending.dataset.pending = String(pending);
    this._pending.textContent = pending > 0 ? `${pending} pending` : '';
    this._pending.title = reason
      ? `workers waiting to be scheduled: ${reason}`
      : 'workers waiting to be scheduled';
    this._pendingReason.textContent = reason ? `pending: ${reason}` : '';
    this._pendingReason.title = reason;
    this._pendingReason.hidden = !reason;
    const waiting = over ? '' : (workers?.waiting ?? '');
    this._workersWaiting.textContent = waiting;
    this._workersWaiting.hidden = !waiting;
    const growth = over ? '' : (workers?.growth ?? '');
    this._growth.textContent = growth ? `throughput policy: ${growth}` : '';
    this._growth.hidden = !growth;
    this._ps.textContent = job.ps !== undefined ? `${job.ps} PS` : '';
    this._age.textContent = job.created ? formatAge(now - job.created) : '';
    this._age.title = job.created
      ? `started ${new Date(job.created * 1000).toLocaleString()}`
      : '';

    const goodput = job.goodput;
    const hasGoodput = typeof goodput === 'number';
    this._goodput.hidden = !hasGoodput;
    this._goodput.dataset.goodput = hasGoodput ? String(goodput) : '';
    this._goodput.textContent = hasGoodput
      ? `goodput ${formatPercent(goodput)}`
      : '';
    const restarts = job.master_restarts ?? 0;
    this._restarts.hidden = restarts <= 0;
    this._restarts.dataset.restarts = String(restarts);
    this._restarts.textContent =
      restarts > 0 ? `master restarted ${restarts}×` : '';
    this._saturated.hidden = over || !job.master_saturated;

    const message = job.error || job.waiting || '';
    this._message.textContent = message;
    this._message.classList.toggle('edl-job-error', !!job.error);
    this._message.hidden = !message;

    // The workers field follows the job, unless the user is choosing a number.
    if (this._target === null && document.activeElement !== this._input) {
      this._input.value = String(desired);
    }
    this._refreshControls();
  }

  private _wire(): void {
    this._down.onclick = () => this._setTarget(this._currentTarget() - 1);
    this._up.onclick = () => this._setTarget(this._currentTarget() + 1);
    this._input.oninput = () => {
      const value = Number(this._input.value);
      this._target = Number.isInteger(value) && value >= 0 ? value : null;
      this._refreshControls();
    };
    this._input.onkeydown = (event: KeyboardEvent) => {
      if (event.key === 'Enter') {
        void this._applyScale();
      } else if (event.key === 'Escape') {
        this._target = null;
        this._input.value = String(this._job.workers?.desired ?? 0);
        this._refreshControls();
      }
    };
    this._apply.onclick = () => void this._applyScale();
    this._logs.onclick = () => this.actions.openLogs(this._job);
    this._attach.onclick = () => this.actions.attach(this._job);
    this._stop.onclick = () =>
      void this._busyWhile(() => this.actions.stop(this._job));
  }

  /** The number the scale controls start from: the pending target, else the desired. */
  private _currentTarget(): number {
    return this._target ?? this._job.workers?.desired ?? 0;
  }

  private _setTarget(workers: number): void {
    this._target = Math.max(0, workers);
    this._input.value = String(this._target);
    this._refreshControls();
  }

  private async _applyScale(): Promise<void> {
    const target = this._target;
    if (target === null || this._apply.disabled) {
      return;
    }
    // A job with a range keeps its MIN: the controls set its MAX ("2:6" -> "2:7").
    const min = this._job.workers?.min ?? 0;
    const asked = min > 0 && target >= min ? `${min}:${target}` : target;
    await this._busyWhile(async () => {
      await this.actions.scale(this._job, asked);
      this._target = null;
    });
  }

  private async _busyWhile(action: () => Promise<void>): Promise<void> {
    this._busy = true;
    this._refreshControls();
    try {
      await action();
    } finally {
      this._busy = false;
      this._refreshControls();
    }
  }

  /** Enable what makes sense for the job's state; remote jobs can only be attached. */
  private _refreshControls(): void {
    const job = this._job;
    const active = !this.isFinal(job.state) && !job.remote;
    const desired = job.workers?.desired ?? 0;
    const target = this._currentTarget();
    this._scaleGroup.hidden = !!job.remote;
    this._logs.hidden = !!job.remote;
    this._stop.hidden = !!job.remote;
    this._down.disabled = this._busy || !active || target <= 0;
    this._up.disabled = this._busy || !active;
    this._input.disabled = this._busy || !active;
    this._apply.disabled =
      this._busy ||
      !active ||
      this._target === null ||
      this._target === desired;
    this._stop.disabled = this._busy || !active;
    this.node.classList.toggle('edl-busy', this._busy);
  }

  private _job: IJobSummary;
  /** The number of workers the user is choosing; null: show the job's own. */
  private _target: number | null = null;
  private _busy = false;
  private readonly _name: HTMLSpanElement;
  private readonly _backend: HTMLSpanElement;
  private readonly _state: HTMLSpanElement;
  private readonly _progress: HTMLDivElement;
  private readonly _fill: HTMLDivElement;
  private readonly _epoch: HTMLSpanElement;
  private readonly _workers: HTMLSpanElement;
  private readonly _pending: HTMLSpanElement;
  private readonly _pendingReason: HTMLDivElement;
  private readonly _workersWaiting: HTMLDivElement;
  private readonly _growth: HTMLDivElement;
  private readonly _ps: HTMLSpanElement;
  private readonly _age: HTMLSpanElement;
  private readonly _goodput: HTMLSpanElement;
  private readonly _restarts: HTMLSpanElement;
  private readonly _saturated: HTMLSpanElement;
  private readonly _message: HTMLDivElement;
  private readonly _scaleGroup: HTMLSpanElement;
  private readonly _down: HTMLButtonElement;
  private readonly _input: HTMLInputElement;
  private readonly _up: HTMLButtonElement;
  private readonly _apply: HTMLButtonElement;
  private readonly _logs: HTMLButtonElement;
  private readonly _attach: HTMLButtonElement;
  private readonly _stop: HTMLButtonElement;
}

/** "93 %", "99.6 %", "100 %": a share as a percentage, a decimal only where it shows. */
export function formatPercent(share: number): string {
  const percent = Math.max(0, Math.min(1, share)) * 100;
  const rounded = Math.round(percent);
  const text =
    rounded === 100 && percent < 100 ? percent.toFixed(1) : String(rounded);
  return `${text} %`;
}

/** "42s", "5m", "3h 20m", "2d": how long ago, to the unit that matters. */
export function formatAge(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) {
    return `${s}s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)}m`;
  }
  if (s < 86400) {
    const minutes = Math.floor((s % 3600) / 60);
    return `${Math.floor(s / 3600)}h` + (minutes ? ` ${minutes}m` : '');
  }
  return `${Math.floor(s / 86400)}d`;
}

function element<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text = ''
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (text) {
    node.textContent = text;
  }
  return node;
}

function button(
  action: string,
  label: string,
  title: string
): HTMLButtonElement {
  const node = element('button', 'edl-button', label);
  node.type = 'button';
  node.dataset.action = action;
  node.title = title;
  node.setAttribute('aria-label', title);
  return node;
}
