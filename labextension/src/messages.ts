/**
 * The messages between the sidebar and the kernel, over the `jupyter_cluster` comm.
 *
 * The kernel pushes each part of its state whole when it changes (the lists are short);
 * the panel never polls. Times are seconds since the epoch (Python's `time.time()`).
 * Every command the panel sends carries a `request` number that the kernel's `reply`
 * echoes. The Python side of this contract is `jupyter_cluster/_sidebar.py`.
 */

/** The comm target both sides register (kernel → panel and panel → kernel). */
export const COMM_TARGET = 'jupyter_cluster';

/** The version of this protocol; the kernel says its own in `hello`. */
export const PROTOCOL_VERSION = 1;

// ------------------------------------------------------------------ state

/** The notebook's link to its cluster. */
export interface ILinkState {
  /** "connecting", "connected", "reconnecting", "detached" or "lost". */
  state: 'connecting' | 'connected' | 'reconnecting' | 'detached' | 'lost';
  /** What the cluster is: "embedded local", "ssh", ... */
  kind: string;
  /** Where the link goes: a socket path or `user@host`. */
  target: string;
  /** The session's name (`%cluster connect ... --session NAME` resumes it). */
  session: string;
  /** The last heartbeat's round trip, in seconds. */
  rtt: number | null;
  /** While reconnecting: when the outage began, attempts so far, the last error. */
  since: number | null;
  attempts: number;
  last_error: string;
  /** Why the link was lost for good (state "lost"). */
  error: string | null;
  ray: string;
  python: string;
  /** Ray's own dashboard, reachable from this browser (an SSH forward), or null. */
  ray_dashboard: string | null;
}

/** A resource's use on one node: `used` of `total`, in its unit (cores, bytes). */
export interface IBar {
  used: number;
  total: number;
}

export interface INodeState {
  id: string;
  address: string;
  head: boolean;
  /** False once the node left the cluster (kept greyed out). */
  alive: boolean;
  cpu: IBar;
  /** Null on a node without GPUs. */
  gpu: IBar | null;
  /** GPU memory in bytes, when the node has GPUs. */
  gram: IBar | null;
  ram: IBar;
  store: IBar;
}

export type CellMode = 'task' | 'actor' | 'driver' | 'map';
export type CellStatus = 'queued' | 'running' | 'done' | 'failed' | 'cancelled';

export interface ICellState {
  id: string;
  /** "Cell In[3]" or the label a helper gave it ("jc.tune(train)"). */
  label: string;
  mode: CellMode;
  /** "task", "actor counter", "driver", "map". */
  where: string;
  node: string | null;
  status: CellStatus;
  submitted: number;
  /** When it ended (null while queued or running). */
  finished: number | null;
  /** `--map` cells: items done, items in all. */
  progress: [number, number] | null;
  /** `--map` cells: the Ray tasks running its items now (each runs a chunk of items). */
  tasks_running?: number | null;
  /**
   * The notebook waits on it: the kernel is busy until it ends, so a comm message would
   * only be read after it. The panel cancels such a cell by interrupting the kernel.
   */
  foreground: boolean;
}

export interface IActorState {
  name: string;
  node: string | null;
  /** The cell it runs now, if any. */
  running: string | null;
  /** Why it is gone or unusable, if it is. */
  error: string | null;
}

export interface IRunState {
  id: string;
  kind: 'train' | 'tune';
  label: string;
  /** "starting", "running", "done", "failed", "cancelled". */
  status: string;
  /** The metric the run optimises or reports, e.g. "loss". */
  metric: string | null;
  mode: 'min' | 'max' | null;
  /** The best value of `metric` so far (Tune), or the last reported one (Train). */
  best: number | null;
  /** `best` as the run's widget in the notebook writes it (4 significant digits). */
  best_text?: string | null;
  /** Tune: trials by state; Train: workers by state. */
  counts: { [state: string]: number };
  started: number;
  finished: number | null;
  /** The cell that runs it (cancelling it stops the run). */
  cell: string | null;
}

export interface IForwardState {
  name: string;
  /** Where it is reachable here, e.g. "http://127.0.0.1:41235". */
  local: string;
  /** What it reaches on the cluster, e.g. "head:8265". */
  remote: string;
}

// ------------------------------------------------------------ kernel → panel

/** Sent first on each comm: the kernel's side of the protocol. A `link` message follows. */
export interface IHelloMessage {
  type: 'hello';
  version: number;
  package_version: string;
}

/** The link; null when no cluster is attached (yet, or any more). */
export interface ILinkMessage {
  type: 'link';
  link: ILinkState | null;
}

/** Only while the panel said it is visible (see `watch`), at most once per interval. */
export interface INodesMessage {
  type: 'nodes';
  t: number;
  /** How old the figures were as the kernel sent them (seconds, by the kernel's clock). */
  age?: number;
  nodes: INodeState[];
  /**
   * The cluster's other Ray jobs' work now, in words (`other notebooks and drivers: 1 actor
   * alive, 4 tasks running`), or '' (older kernels send none).
   */
  others?: string;
}

/** Running cells, then the most recent finished ones (at most 10), newest first. */
export interface ICellsMessage {
  type: 'cells';
  cells: ICellState[];
}

export interface IActorsMessage {
  type: 'actors';
  actors: IActorState[];
}

export interface IRunsMessage {
  type: 'runs';
  runs: IRunState[];
}

export interface IForwardsMessage {
  type: 'forwards';
  forwards: IForwardState[];
}

/** The answer to a command; for `dashboard`, `outputs` are what to show in its pane. */
export interface IReplyMessage {
  type: 'reply';
  request: number;
  ok: boolean;
  message: string;
  outputs?: IOutput[];
}

/** A display_data output, as nbformat writes it. */
export interface IOutput {
  output_type: 'display_data';
  data: { [mime: string]: unknown };
  metadata: { [key: string]: unknown };
}

export type KernelMessage =
  | IHelloMessage
  | ILinkMessage
  | INodesMessage
  | ICellsMessage
  | IActorsMessage
  | IRunsMessage
  | IForwardsMessage
  | IReplyMessage;

// ------------------------------------------------------------ panel → kernel

/** Whether the panel is visible, and how often it wants the node bars (seconds). */
export interface IWatchCommand {
  type: 'watch';
  visible: boolean;
  interval: number;
}

export interface ICancelCommand {
  type: 'cancel';
  request: number;
  cell: string;
}

export interface IKillActorCommand {
  type: 'kill_actor';
  request: number;
  name: string;
}

/** Make a live dashboard widget; the reply's outputs show it. */
export interface IDashboardCommand {
  type: 'dashboard';
  request: number;
}

export interface IDetachCommand {
  type: 'detach';
  request: number;
}

export interface IDownCommand {
  type: 'down';
  request: number;
}

export type PanelCommand =
  | IWatchCommand
  | ICancelCommand
  | IKillActorCommand
  | IDashboardCommand
  | IDetachCommand
  | IDownCommand;

/** Commands that expect a reply. */
export type PanelRequest = Exclude<PanelCommand, IWatchCommand>;

const KERNEL_TYPES = new Set([
  'hello',
  'link',
  'nodes',
  'cells',
  'actors',
  'runs',
  'forwards',
  'reply'
]);

/** The message in a comm's data, or null if it is not one of ours. */
export function parseKernelMessage(data: unknown): KernelMessage | null {
  if (typeof data !== 'object' || data === null) {
    return null;
  }
  const type = (data as { type?: unknown }).type;
  if (typeof type !== 'string' || !KERNEL_TYPES.has(type)) {
    return null;
  }
  return data as KernelMessage;
}
