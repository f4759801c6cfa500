/**
 * The client of the server extension's job API (elasticdl_nb/server/):
 *
 *     GET    {base}elasticdl/api/jobs               the jobs, and which states are final
 *     PATCH  {base}elasticdl/api/jobs/{name}        {"workers": N or "MIN:MAX"}: scale
 *     DELETE {base}elasticdl/api/jobs/{name}        stop
 *     GET    {base}elasticdl/api/jobs/{name}/logs   ?role=&index=&tail=
 *
 * Each takes `?namespace=NS`: the list then also holds the Kubernetes jobs there that
 * other notebooks started (`remote`), and a per-job call finds such a job by its labels.
 *
 * Requests go through JupyterLab's `ServerConnection`, which adds the user's
 * credentials and the XSRF token the state-changing calls need.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** The states a job goes through; a Kubernetes job found only in a namespace may be "ended". */
export type JobState =
  | 'starting'
  | 'running'
  | 'succeeded'
  | 'failed'
  | 'stopped'
  | 'lost'
  | 'ended'
  | string;

/** How far the training has got. */
export interface IJobProgress {
  epoch: number;
  epochs: number;
  step: number;
  /** Done, from 0 to 1. */
  fraction: number;
  records_per_second: number;
}

/** A job's workers (`JobView.workers_summary` in elasticdl_nb/sdk/view/job_view.py). */
export interface IWorkers {
  /** Started or running. */
  live: number;
  /** Asked for: the number, or a range's MAX. */
  desired: number;
  /** A range's MIN (workers="2:6"); 0 or absent: a fixed number. */
  min?: number;
  /** Waiting to be scheduled or started. */
  pending?: number;
  /** Why the newest pending worker waits, in the scheduler's words ('' if not known). */
  pending_reason?: string;
  /** Why training waits for workers ('' when it does not): a range job below its MIN. */
  waiting?: string;
  /**
   * What the throughput policy (scale_policy="throughput") does now, in its words:
   * "holding at 3: the 4th added 2%" ('' without the policy or once the job has ended).
   */
  growth?: string;
}

/** A job as the list shows it (`job_summary` in elasticdl_nb/server/summary.py). */
export interface IJobSummary {
  name: string;
  backend: 'local' | 'kubernetes' | string;
  state: JobState;
  /** Why the job failed, if it did. */
  error?: string;
  /** What the job is waiting for (pending pods, a slow start), if anything. */
  waiting?: string;
  /** When the job was created, in Unix seconds (in the list; a stop's answer has none). */
  created?: number;
  progress?: IJobProgress;
  workers?: IWorkers;
  ps?: number;
  metrics?: Record<string, number>;
  /**
   * Worker time spent training over the worker time wanted, 0..1, as the master counts
   * it (README, "Goodput"); null before the first minibatch.
   */
  goodput?: number | null;
  /** How many times the job's master died and was replaced. */
  master_restarts?: number;
  /** The master is behind its workers: it turns calls away, or they wait for a thread. */
  master_saturated?: boolean;
  /** A Kubernetes job that only the namespace knows (another notebook started it). */
  remote?: boolean;
}

/** The answer to a list request. */
export interface IJobList {
  jobs: IJobSummary[];
  /** The states after which nothing about a job changes any more (the server's vocabulary). */
  final_states: JobState[];
}

/** The answer to a scale request. */
export interface IScaleResult {
  workers_from: number;
  workers_to: number;
}

/** The roles whose logs can be read. */
export type LogRole = 'master' | 'worker' | 'ps';

/** A tail of one process's log. */
export interface ILogs {
  role: LogRole;
  index: number;
  text: string;
}

/** The server answered, with an error: `message` is its own explanation. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

/** The server could not be reached at all (stopped, restarting, network down). */
export class UnreachableError extends Error {
  constructor(message = 'server unreachable') {
    super(message);
    this.name = 'UnreachableError';
  }
}

/** Talks to the job API of the Jupyter server this JupyterLab came from. */
export class JobsClient {
  constructor(
    private readonly serverSettings: ServerConnection.ISettings = ServerConnection.makeSettings()
  ) {}

  /**
   * Every job this machine knows, plus those of `namespace` when given, and the
   * states that are final.
   */
  listJobs(namespace = ''): Promise<IJobList> {
    return this.request<IJobList>('', queryString({ namespace }));
  }

  /**
   * Ask for `workers` workers (N, or a range "MIN:MAX"); the job adds or removes them
   * over the next seconds.
   * `namespace`: where a job another notebook started is (see `IJobSummary.remote`).
   */
  scale(
    name: string,
    workers: number | string,
    namespace = ''
  ): Promise<IScaleResult> {
    return this.request<IScaleResult>(
      jobPath(name),
      queryString({ namespace }),
      {
        method: 'PATCH',
        body: JSON.stringify({ workers })
      }
    );
  }

  /** Stop the job; resolves with its summary (without `created`) once it has stopped. */
  stop(name: string, namespace = ''): Promise<IJobSummary> {
    return this.request<IJobSummary>(
      jobPath(name),
      queryString({ namespace }),
      {
        method: 'DELETE'
      }
    );
  }

  /** The last `tail` lines of one process's log. */
  logs(name: string, role: LogRole, index = 0, tail = 200): Promise<ILogs> {
    return this.request<ILogs>(
      `${jobPath(name)}/logs`,
      queryString({ role, index: String(index), tail: String(tail) })
    );
  }

  private async request<T>(
    path: string,
    query: string,
    init: RequestInit = {}
  ): Promise<T> {
    const url =
      URLExt.join(this.serverSettings.baseUrl, 'elasticdl/api/jobs', path) +
      query;
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(
        url,
        init,
        this.serverSettings
      );
    } catch (error) {
      // fetch() itself failed: nobody answered
      throw new UnreachableError((error as Error).message);
    }
    const text = await response.text();
    let body: unknown = undefined;
    try {
      body = text ? JSON.parse(text) : undefined;
    } catch {
      // a proxy's HTML error page, say: keep the status
    }
    if (
      response.status === 502 ||
      response.status === 503 ||
      response.status === 504
    ) {
      throw new UnreachableError(`${response.status} ${response.statusText}`); // a proxy in front
    }
    if (!response.ok) {
      const message =
        (body as { message?: string } | undefined)?.message ||
        `${response.status} ${response.statusText}`;
      throw new ApiError(response.status, message);
    }
    return body as T;
  }
}

/** `?a=1&b=2` of the arguments that are not empty ('' for none). */
function queryString(args: Record<string, string>): string {
  const given = Object.entries(args).filter(([, value]) => value !== '');
  return given.length ? `?${new URLSearchParams(given).toString()}` : '';
}

/** The API path of one job (names are lowercase letters, digits and '-'). */
function jobPath(name: string): string {
  return encodeURIComponent(name);
}
