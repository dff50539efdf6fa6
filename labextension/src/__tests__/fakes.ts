/**
 * A kernel and its comms, as far as the sidebar uses them, recording what is sent.
 */

import { Kernel, KernelMessage as JupyterMessage } from '@jupyterlab/services';
import { Signal } from '@lumino/signaling';

import { KernelConnection } from '../connection';
import { COMM_TARGET, KernelMessage } from '../messages';

let lastId = 0;

/** A comm that records what the panel sends and lets a test play the kernel's side. */
export class FakeComm {
  constructor(
    readonly targetName: string,
    readonly commId = `comm-${++lastId}`
  ) {}

  onMsg: (msg: JupyterMessage.ICommMsgMsg) => void = () => undefined;
  onClose: (msg: JupyterMessage.ICommCloseMsg) => void = () => undefined;
  opened: unknown = undefined;
  sent: unknown[] = [];
  closedByPanel = false;
  isDisposed = false;

  open(data?: unknown): void {
    this.opened = data;
  }

  send(data: unknown): void {
    this.sent.push(data);
  }

  close(): void {
    this.closedByPanel = true;
    this.isDisposed = true;
  }

  dispose(): void {
    this.isDisposed = true;
  }

  /** The kernel sends a message on this comm. */
  receive(data: KernelMessage): void {
    this.onMsg({
      content: { comm_id: this.commId, data }
    } as unknown as JupyterMessage.ICommMsgMsg);
  }

  /** The kernel closes this comm. */
  closeFromKernel(): void {
    this.isDisposed = true;
    this.onClose({
      content: { comm_id: this.commId, data: {} }
    } as unknown as JupyterMessage.ICommCloseMsg);
  }
}

type Target = (comm: Kernel.IComm, msg: JupyterMessage.ICommOpenMsg) => void;

/** A kernel connection with comm targets, comms, status and interrupt. */
export class FakeKernel {
  readonly statusChanged = new Signal<this, JupyterMessage.Status>(this);
  readonly disposed = new Signal<this, void>(this);
  readonly targets = new Map<string, Target>();
  readonly comms: FakeComm[] = [];
  readonly interrupt = jest.fn(() => Promise.resolve());
  isDisposed = false;

  registerCommTarget(name: string, callback: Target): void {
    this.targets.set(name, callback);
  }

  removeCommTarget(name: string, callback: Target): void {
    if (this.targets.get(name) === callback) {
      this.targets.delete(name);
    }
  }

  createComm(target: string): FakeComm {
    const comm = new FakeComm(target);
    this.comms.push(comm);
    return comm;
  }

  /** The kernel opens a comm to the page, as `%load_ext jupyter_cluster` does. */
  openFromKernel(data: KernelMessage): FakeComm {
    const comm = new FakeComm(COMM_TARGET);
    const target = this.targets.get(COMM_TARGET);
    if (target === undefined) {
      throw new Error('no comm target registered');
    }
    target(
      comm as unknown as Kernel.IComm,
      {
        content: { comm_id: comm.commId, target_name: COMM_TARGET, data }
      } as unknown as JupyterMessage.ICommOpenMsg
    );
    return comm;
  }

  setStatus(status: JupyterMessage.Status): void {
    this.statusChanged.emit(status);
  }

  asKernel(): Kernel.IKernelConnection {
    return this as unknown as Kernel.IKernelConnection;
  }
}

/** A connection to a fake kernel whose extension opened a comm and sent `messages`. */
export function connected(
  messages: KernelMessage[],
  options: KernelConnection.IOptions = {}
): { kernel: FakeKernel; comm: FakeComm; connection: KernelConnection } {
  const kernel = new FakeKernel();
  const connection = new KernelConnection(kernel.asKernel(), options);
  const [first, ...rest] = messages;
  const comm = kernel.openFromKernel(first);
  for (const message of rest) {
    comm.receive(message);
  }
  return { kernel, comm, connection };
}

/** Wait until the promises already settled have run their callbacks. */
export async function flush(): Promise<void> {
  for (let i = 0; i < 5; i++) {
    await Promise.resolve();
  }
}
