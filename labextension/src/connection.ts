/**
 * The comm between the sidebar and one kernel's `jupyter_cluster`.
 */

import { JSONObject } from '@lumino/coreutils';
import { IDisposable } from '@lumino/disposable';
import { Kernel, KernelMessage as JupyterMessage } from '@jupyterlab/services';

import {
  COMM_TARGET,
  IReplyMessage,
  KernelMessage,
  PanelCommand,
  PanelRequest,
  parseKernelMessage
} from './messages';
import { ClusterModel } from './model';

/** How long a request waits for its reply (ms). */
export const REQUEST_TIMEOUT = 60_000;

/** Said when a command needs the kernel's extension and it is not there. */
export const NOT_LOADED =
  'jupyter_cluster is not loaded in this kernel: run `%load_ext jupyter_cluster` first';

/** A command without its request number: the connection numbers it. */
export type RequestCommand = PanelRequest extends infer R
  ? R extends PanelRequest
    ? Omit<R, 'request'>
    : never
  : never;

/** What the views need of a kernel's connection (tests give them a fake one). */
export interface IClusterConnection {
  /** The state the kernel sent. */
  readonly model: ClusterModel;
  /** Send a command and wait for the kernel's reply. */
  request(command: RequestCommand): Promise<IReplyMessage>;
  /** Interrupt the kernel (a foreground cell keeps it from reading the comm). */
  interrupt(): Promise<void>;
}

interface IPending {
  resolve: (reply: IReplyMessage) => void;
  reject: (error: Error) => void;
  timer: number;
  /** The comm it went out on; null while it waits for a probe. */
  comm: Kernel.IComm | null;
}

/**
 * Follows one kernel: keeps the comm to its `jupyter_cluster` and feeds a model.
 *
 * The kernel opens a comm when `%load_ext jupyter_cluster` runs; for a kernel that loaded
 * it before this page did, `probe()` opens one from here (the kernel answers with
 * `hello`, or closes it when the extension is not loaded). A restart forgets it all.
 */
export class KernelConnection implements IClusterConnection, IDisposable {
  constructor(
    kernel: Kernel.IKernelConnection,
    options: KernelConnection.IOptions = {}
  ) {
    this.kernel = kernel;
    this._timeout = options.timeout ?? REQUEST_TIMEOUT;
    kernel.registerCommTarget(COMM_TARGET, this._onCommOpen);
    kernel.statusChanged.connect(this._onStatus, this);
    kernel.disposed.connect(this.dispose, this);
  }

  /** The kernel followed. */
  readonly kernel: Kernel.IKernelConnection;

  /** What the kernel sent. */
  readonly model = new ClusterModel();

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /** Whether a comm to the kernel's extension is open. */
  get isOpen(): boolean {
    return this._comm !== null;
  }

  /**
   * Without a comm, open one from here (once) for a kernel whose extension was loaded
   * before this page; resolves when the kernel said hello or refused the comm.
   */
  probe(): Promise<void> {
    if (this._comm !== null) {
      return Promise.resolve();
    }
    if (this._probe === null) {
      this._probe = this._openFromHere();
    }
    return this._probe;
  }

  /** Tell the kernel whether the panel shows and how often it wants the nodes (s). */
  watch(visible: boolean, interval: number): void {
    if (visible === this._visible && interval === this._interval) {
      return;
    }
    this._visible = visible;
    this._interval = interval;
    if (this._comm !== null) {
      this.send(this._watchCommand());
    }
  }

  /** Send a command without waiting for anything. */
  send(command: PanelCommand): void {
    if (this._comm === null) {
      throw new Error(NOT_LOADED);
    }
    this._comm.send(command as unknown as JSONObject);
  }

  /**
   * Send a command with the next request number; resolves with its reply. Without a
   * comm it probes first (a kernel may have loaded the extension before this page); the
   * timeout counts from the call.
   */
  request(command: RequestCommand): Promise<IReplyMessage> {
    const request = ++this._lastRequest;
    const message = { ...command, request } as PanelRequest;
    return new Promise<IReplyMessage>((resolve, reject) => {
      const timer = window.setTimeout(() => {
        this._settle(
          request,
          new Error(
            `The kernel did not answer in ${this._timeout / 1000} s: is a cell still running?`
          )
        );
      }, this._timeout);
      const pending: IPending = { resolve, reject, timer, comm: null };
      this._pending.set(request, pending);
      const send = () => {
        if (!this._pending.has(request)) {
          return;
        }
        try {
          this.send(message);
          pending.comm = this._comm;
        } catch (error) {
          this._settle(request, error as Error);
        }
      };
      if (this._comm === null) {
        void this.probe().then(send);
      } else {
        send();
      }
    });
  }

  interrupt(): Promise<void> {
    return this.kernel.interrupt();
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    this.kernel.removeCommTarget(COMM_TARGET, this._onCommOpen);
    this.kernel.statusChanged.disconnect(this._onStatus, this);
    this.kernel.disposed.disconnect(this.dispose, this);
    const comm = this._comm;
    this._comm = null;
    if (comm !== null) {
      this._close(comm);
    }
    this._rejectAll('The sidebar stopped following this kernel');
    this._settleProbe?.();
  }

  private _openFromHere(): Promise<void> {
    return new Promise<void>(resolve => {
      this._settleProbe = () => {
        this._settleProbe = null;
        resolve();
      };
      try {
        const comm = this.kernel.createComm(COMM_TARGET);
        this._adopt(comm);
        // The kernel handles a command in the open message: no extra round trip.
        comm.open(this._watchCommand() as unknown as JSONObject);
      } catch (error) {
        console.warn('jupyter_cluster: could not open a comm', error);
        this._comm = null;
        this._settleProbe();
      }
    });
  }

  private _onCommOpen = (
    comm: Kernel.IComm,
    msg: JupyterMessage.ICommOpenMsg
  ): void => {
    this._adopt(comm);
    const hello = parseKernelMessage(msg.content.data);
    if (hello !== null) {
      this._receive(hello);
    }
    this.send(this._watchCommand());
  };

  /** Make `comm` the one to the kernel; a previous one is closed. */
  private _adopt(comm: Kernel.IComm): void {
    const previous = this._comm;
    this._comm = comm;
    comm.onMsg = msg => {
      if (comm === this._comm) {
        const message = parseKernelMessage(msg.content.data);
        if (message !== null) {
          this._receive(message);
        }
      }
    };
    comm.onClose = () => {
      if (comm === this._comm) {
        this._comm = null;
        this._rejectAll(NOT_LOADED);
        this.model.reset();
        this._settleProbe?.();
      }
    };
    if (previous !== null && previous !== comm) {
      // Replies to what went out on the old comm would come back on it.
      this._rejectAll('The kernel opened a new comm to the sidebar', previous);
      this._close(previous);
    }
  }

  private _receive(message: KernelMessage): void {
    if (message.type === 'reply') {
      this._settle(message.request, message);
      return;
    }
    this.model.apply(message);
    if (message.type === 'hello') {
      this._settleProbe?.();
    }
  }

  private _onStatus(
    kernel: Kernel.IKernelConnection,
    status: JupyterMessage.Status
  ): void {
    if (
      status === 'restarting' ||
      status === 'autorestarting' ||
      status === 'dead'
    ) {
      // The kernel's comms are gone with it: its next `%load_ext` opens a new one.
      this._comm = null;
      this._rejectAll('The kernel restarted');
      this.model.reset();
      this._settleProbe?.();
    }
  }

  private _settle(request: number, outcome: IReplyMessage | Error): void {
    const pending = this._pending.get(request);
    if (pending === undefined) {
      return;
    }
    this._pending.delete(request);
    window.clearTimeout(pending.timer);
    if (outcome instanceof Error) {
      pending.reject(outcome);
    } else {
      pending.resolve(outcome);
    }
  }

  /** Reject the pending requests (only those sent on `comm`, if given). */
  private _rejectAll(reason: string, comm?: Kernel.IComm): void {
    for (const [request, pending] of [...this._pending]) {
      if (comm === undefined || pending.comm === comm) {
        this._settle(request, new Error(reason));
      }
    }
  }

  private _close(comm: Kernel.IComm): void {
    comm.onMsg = () => undefined;
    comm.onClose = () => undefined;
    if (!comm.isDisposed && !this.kernel.isDisposed) {
      try {
        comm.close();
      } catch {
        // The kernel went away meanwhile: nothing left to close.
      }
    }
  }

  private _watchCommand(): PanelCommand {
    return { type: 'watch', visible: this._visible, interval: this._interval };
  }

  private _comm: Kernel.IComm | null = null;
  private _probe: Promise<void> | null = null;
  private _settleProbe: (() => void) | null = null;
  private _pending = new Map<number, IPending>();
  private _lastRequest = 0;
  private _visible = false;
  private _interval = 1;
  private _timeout: number;
  private _isDisposed = false;
}

/** The options of a kernel connection. */
export namespace KernelConnection {
  export interface IOptions {
    /** How long a request waits for its reply (ms); 60 s by default. */
    timeout?: number;
  }
}
