import { ClusterModel, ClusterPart } from '../model';
import * as fx from './fixtures';

function record(model: ClusterModel): ClusterPart[] {
  const parts: ClusterPart[] = [];
  model.changed.connect((_, part) => parts.push(part));
  return parts;
}

describe('ClusterModel', () => {
  it('is neither loaded nor attached before the kernel says hello', () => {
    const model = new ClusterModel();
    expect(model.loaded).toBe(false);
    expect(model.attached).toBe(false);
    expect(model.link).toBeNull();
    expect(model.cells).toEqual([]);
  });

  it('takes in a recorded session part by part', () => {
    const model = new ClusterModel();
    const parts = record(model);
    fx.session.forEach(message => model.apply(message));
    expect(parts).toEqual([
      'hello',
      'link',
      'cells',
      'actors',
      'runs',
      'forwards',
      'nodes'
    ]);
    expect(model.attached).toBe(true);
    expect(model.packageVersion).toBe('0.1.0');
    expect(model.link?.kind).toBe('embedded local');
    expect(model.nodes.map(node => node.address)).toEqual([
      '10.0.0.1',
      '10.0.0.2',
      '10.0.0.3'
    ]);
    // When the figures were true, by the browser's clock: their arrival less the age the kernel gave them.
    expect(model.nodesTime).toBeCloseTo(
      Date.now() / 1000 - (fx.nodes.age ?? 0),
      0
    );
    expect(model.cells).toHaveLength(5);
    expect(model.cell('c-fg')?.foreground).toBe(true);
    expect(model.actors.map(actor => actor.name)).toEqual(['counter', 'model']);
    expect(model.runs.map(run => run.kind)).toEqual(['tune', 'train']);
    expect(model.forwards[0].local).toBe('http://127.0.0.1:41235');
    expect(model.mismatch).toBeNull();
  });

  it('is loaded but not attached while the link is null', () => {
    const model = new ClusterModel();
    model.apply(fx.hello);
    model.apply(fx.linkNone);
    expect(model.loaded).toBe(true);
    expect(model.attached).toBe(false);
  });

  it('is not attached by a link that came without hello', () => {
    const model = new ClusterModel();
    model.apply(fx.linkConnected);
    expect(model.attached).toBe(false);
  });

  it('replaces a part whole', () => {
    const model = new ClusterModel();
    model.apply(fx.linkConnected);
    model.apply(fx.linkReconnecting);
    expect(model.link?.state).toBe('reconnecting');
    expect(model.link?.attempts).toBe(3);
  });

  it('leaves replies to the connection', () => {
    const model = new ClusterModel();
    const parts = record(model);
    model.apply({ type: 'reply', request: 1, ok: true, message: '' });
    expect(parts).toEqual([]);
  });

  it('forgets everything on reset', () => {
    const model = new ClusterModel();
    fx.session.forEach(message => model.apply(message));
    const parts = record(model);
    model.reset();
    expect(parts).toEqual(['all']);
    expect(model.loaded).toBe(false);
    expect(model.attached).toBe(false);
    expect(model.nodes).toEqual([]);
    expect(model.cells).toEqual([]);
    expect(model.actors).toEqual([]);
    expect(model.runs).toEqual([]);
    expect(model.forwards).toEqual([]);
  });

  it('says when the kernel speaks another protocol', () => {
    const model = new ClusterModel();
    model.apply({ ...fx.hello, version: 2, package_version: '0.9.0' });
    expect(model.mismatch).toContain('protocol 2');
    expect(model.mismatch).toContain('0.9.0');
  });
});
