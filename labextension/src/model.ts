/**
 * What one kernel's `jupyter_cluster` has told the sidebar, kept as plain state.
 */

import { ISignal, Signal } from '@lumino/signaling';

import {
  IActorState,
  ICellState,
  IForwardState,
  ILinkState,
  INodeState,
  IRunState,
  KernelMessage,
  PROTOCOL_VERSION
} from './messages';

/** The part of the state a message replaced; `all` after a reset. */
export type ClusterPart =
  'hello' | 'link' | 'nodes' | 'cells' | 'actors' | 'runs' | 'forwards' | 'all';

/**
 * The state of one kernel's cluster, fed with the kernel's messages (`apply`).
 *
 * No DOM and no comm: a connection feeds it and views read it. `loaded` turns true with
 * the kernel's `hello`; `attached` once a `link` names a cluster.
 */
export class ClusterModel {
  /** Emitted with the part that changed. */
  get changed(): ISignal<this, ClusterPart> {
    return this._changed;
  }

  /** Whether `jupyter_cluster` is loaded in the kernel (it said hello). */
  get loaded(): boolean {
    return this._kernelVersion !== null;
  }

  /** Whether a cluster is attached: the kernel said hello and its link is not null. */
  get attached(): boolean {
    return this.loaded && this._link !== null;
  }

  /** The protocol version the kernel speaks, once it said hello. */
  get kernelVersion(): number | null {
    return this._kernelVersion;
  }

  /** The kernel's `jupyter_cluster` version, once it said hello. */
  get packageVersion(): string {
    return this._packageVersion;
  }

  /** A sentence when the kernel speaks another protocol than this sidebar, else null. */
  get mismatch(): string | null {
    const version = this._kernelVersion;
    if (version === null || version === PROTOCOL_VERSION) {
      return null;
    }
    return (
      `The kernel's jupyter_cluster ${this._packageVersion} speaks protocol ${version}, ` +
      `this sidebar ${PROTOCOL_VERSION}: install the same version in both.`
    );
  }

  get link(): ILinkState | null {
    return this._link;
  }

  get nodes(): readonly INodeState[] {
    return this._nodes;
  }

  /** Other notebooks' and Ray drivers' work on the cluster, in words, or ''. */
  get others(): string {
    return this._others;
  }

  /** When the kernel sampled `nodes` (seconds since the epoch), or null. */
  get nodesTime(): number | null {
    return this._nodesTime;
  }

  /** Running cells, then the most recent finished ones, newest first. */
  get cells(): readonly ICellState[] {
    return this._cells;
  }

  get actors(): readonly IActorState[] {
    return this._actors;
  }

  get runs(): readonly IRunState[] {
    return this._runs;
  }

  get forwards(): readonly IForwardState[] {
    return this._forwards;
  }

  /** The cell with this id, if the kernel listed it. */
  cell(id: string): ICellState | undefined {
    return this._cells.find(cell => cell.id === id);
  }

  /** Take in one kernel message; a `reply` is not state and leaves the model as it is. */
  apply(msg: KernelMessage): void {
    switch (msg.type) {
      case 'hello':
        this._kernelVersion = msg.version;
        this._packageVersion = msg.package_version;
        break;
      case 'link':
        this._link = msg.link;
        break;
      case 'nodes':
        this._nodes = msg.nodes;
        this._others = msg.others ?? '';
        // When the figures were true, by this browser's clock (the kernel's may differ): arrival less their age.
        this._nodesTime = Date.now() / 1000 - (msg.age ?? 0);
        break;
      case 'cells':
        this._cells = msg.cells;
        break;
      case 'actors':
        this._actors = msg.actors;
        break;
      case 'runs':
        this._runs = msg.runs;
        break;
      case 'forwards':
        this._forwards = msg.forwards;
        break;
      case 'reply':
        return;
    }
    this._changed.emit(msg.type);
  }

  /** Forget everything: the kernel restarted, or its comm closed. */
  reset(): void {
    this._kernelVersion = null;
    this._packageVersion = '';
    this._link = null;
    this._nodes = [];
    this._others = '';
    this._nodesTime = null;
    this._cells = [];
    this._actors = [];
    this._runs = [];
    this._forwards = [];
    this._changed.emit('all');
  }

  private _changed = new Signal<this, ClusterPart>(this);
  private _kernelVersion: number | null = null;
  private _packageVersion = '';
  private _link: ILinkState | null = null;
  private _nodes: readonly INodeState[] = [];
  private _nodesTime: number | null = null;
  private _others = '';
  private _cells: readonly ICellState[] = [];
  private _actors: readonly IActorState[] = [];
  private _runs: readonly IRunState[] = [];
  private _forwards: readonly IForwardState[] = [];
}
