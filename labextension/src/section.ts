/**
 * The base of the sidebar's sections: a titled list that follows one connection's model.
 */

import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { IClusterConnection } from './connection';
import { ClusterModel, ClusterPart } from './model';

/** The sections the settings can show or hide. */
export type SectionName =
  'link' | 'nodes' | 'cells' | 'actors' | 'runs' | 'forwards';

/**
 * A titled part of the sidebar that redraws when its parts of the model change.
 *
 * Subclasses draw into `body`; `showError` writes a command's failure under the title.
 */
export abstract class SectionView extends Widget {
  constructor(name: SectionName, title: string, parts: ClusterPart[]) {
    super();
    this.name = name;
    this._parts = parts;
    this.addClass('jc-section');
    this.addClass(`jc-section-${name}`);
    const header = document.createElement('h3');
    header.className = 'jc-section-title';
    header.textContent = title;
    this._error.className = 'jc-error';
    this._error.hidden = true;
    this.body.className = 'jc-section-body';
    this.node.append(header, this._error, this.body);
  }

  /** Which section this is, as the settings name it. */
  readonly name: SectionName;

  /** The connection shown, or null. */
  get connection(): IClusterConnection | null {
    return this._connection;
  }

  set connection(connection: IClusterConnection | null) {
    if (connection === this._connection) {
      return;
    }
    this._connection?.model.changed.disconnect(this._onChanged, this);
    this._connection = connection;
    connection?.model.changed.connect(this._onChanged, this);
    this.showError(null);
    this.refresh();
  }

  /** Draw the section again from the model. */
  refresh(): void {
    const connection = this._connection;
    if (connection !== null) {
      this.render(connection.model);
    } else {
      this.body.replaceChildren();
    }
  }

  /** Show a command's failure under the title; null hides it. */
  showError(message: string | null): void {
    this._error.textContent = message ?? '';
    this._error.hidden = message === null;
  }

  dispose(): void {
    this.connection = null;
    this.setClock(null);
    super.dispose();
  }

  /** Fill `body` from the model. */
  protected abstract render(model: ClusterModel): void;

  /** Send a command and show its failure (a reply with ok=false, or no reply). */
  protected async run(
    command: Parameters<IClusterConnection['request']>[0],
    onError: (message: string) => void = message => this.showError(message)
  ): Promise<boolean> {
    const connection = this._connection;
    if (connection === null) {
      return false;
    }
    try {
      const reply = await connection.request(command);
      if (!reply.ok) {
        onError(reply.message);
      }
      return reply.ok;
    } catch (error) {
      onError((error as Error).message);
      return false;
    }
  }

  protected readonly body = document.createElement('div');

  /**
   * Call `tick` once a second, only while the section is visible (a browser timer, stopped
   * when hidden or detached); null stops it. Sections with clocks (elapsed times, the age
   * of figures) set it after each render.
   */
  protected setClock(tick: (() => void) | null): void {
    this._tick = tick;
    this._updateClock();
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this._updateClock();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._updateClock();
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._stopClock();
  }

  protected onBeforeDetach(msg: Message): void {
    this._stopClock();
    super.onBeforeDetach(msg);
  }

  private _updateClock(): void {
    if (this._tick === null || !this.isVisible) {
      this._stopClock();
    } else if (this._timer === null) {
      this._timer = window.setInterval(() => this._tick?.(), 1000);
    }
  }

  private _stopClock(): void {
    if (this._timer !== null) {
      window.clearInterval(this._timer);
      this._timer = null;
    }
  }

  private _onChanged(model: ClusterModel, part: ClusterPart): void {
    if (part === 'all' || this._parts.includes(part)) {
      this.render(model);
    }
  }

  private _connection: IClusterConnection | null = null;
  private _parts: ClusterPart[];
  private _error = document.createElement('div');
  private _tick: (() => void) | null = null;
  private _timer: number | null = null;
}

/** A DOM element with a class and, optionally, its text. */
export function element<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** A small button of the sidebar's rows. */
export function button(
  label: string,
  className: string,
  onClick: () => void,
  title?: string
): HTMLButtonElement {
  const node = element('button', `jc-button ${className}`, label);
  node.type = 'button';
  if (title !== undefined) {
    node.title = title;
  }
  node.addEventListener('click', onClick);
  return node;
}

/** A muted line saying a list is empty. */
export function emptyLine(text: string): HTMLElement {
  return element('div', 'jc-empty', text);
}
