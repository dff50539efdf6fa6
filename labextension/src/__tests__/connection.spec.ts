import { KernelConnection, NOT_LOADED } from '../connection';
import { COMM_TARGET } from '../messages';
import { FakeKernel, connected, flush } from './fakes';
import * as fx from './fixtures';

describe('KernelConnection', () => {
  it('registers the comm target and takes the comm the kernel opens', () => {
    const kernel = new FakeKernel();
    const connection = new KernelConnection(kernel.asKernel());
    expect(kernel.targets.has(COMM_TARGET)).toBe(true);
    expect(connection.isOpen).toBe(false);

    const comm = kernel.openFromKernel(fx.hello);
    expect(connection.isOpen).toBe(true);
    expect(connection.model.loaded).toBe(true);
    expect(comm.sent).toEqual([{ type: 'watch', visible: false, interval: 1 }]);

    comm.receive(fx.linkConnected);
    comm.receive(fx.nodes);
    expect(connection.model.attached).toBe(true);
    expect(connection.model.nodes).toHaveLength(3);
  });

  it('ignores comm data that is not one of its messages', () => {
    const { comm, connection } = connected([fx.hello]);
    comm.receive({ type: 'bogus' } as never);
    expect(connection.model.link).toBeNull();
  });

  it('tells the kernel its visibility only when it changes', () => {
    const { comm, connection } = connected([fx.hello]);
    comm.sent = [];
    connection.watch(true, 1);
    connection.watch(true, 1);
    connection.watch(true, 0.5);
    connection.watch(false, 0.5);
    expect(comm.sent).toEqual([
      { type: 'watch', visible: true, interval: 1 },
      { type: 'watch', visible: true, interval: 0.5 },
      { type: 'watch', visible: false, interval: 0.5 }
    ]);
  });

  it('numbers requests and matches replies, in any order', async () => {
    const { comm, connection } = connected([fx.hello, fx.linkConnected]);
    comm.sent = [];
    const first = connection.request({ type: 'cancel', cell: 'c-map' });
    const second = connection.request({ type: 'kill_actor', name: 'counter' });
    await flush();
    expect(comm.sent).toEqual([
      { type: 'cancel', cell: 'c-map', request: 1 },
      { type: 'kill_actor', name: 'counter', request: 2 }
    ]);
    comm.receive({
      type: 'reply',
      request: 2,
      ok: false,
      message: 'no such actor'
    });
    comm.receive({
      type: 'reply',
      request: 1,
      ok: true,
      message: 'cancelling'
    });
    await expect(second).resolves.toMatchObject({
      ok: false,
      message: 'no such actor'
    });
    await expect(first).resolves.toMatchObject({ ok: true, request: 1 });
  });

  it('rejects a request that gets no reply in time', async () => {
    const { connection } = connected([fx.hello], { timeout: 20 });
    await expect(connection.request({ type: 'dashboard' })).rejects.toThrow(
      'did not answer in 0.02 s'
    );
  });

  it('rejects requests and forgets the state when the kernel closes the comm', async () => {
    const { kernel, comm, connection } = connected(fx.session);
    const pending = connection.request({ type: 'down' });
    await flush();
    comm.closeFromKernel();
    await expect(pending).rejects.toThrow(NOT_LOADED);
    expect(connection.isOpen).toBe(false);
    expect(connection.model.loaded).toBe(false);

    // A later request asks the kernel first; a kernel without the extension refuses.
    const later = connection.request({ type: 'down' });
    expect(kernel.comms).toHaveLength(1);
    kernel.comms[0].closeFromKernel();
    await expect(later).rejects.toThrow(NOT_LOADED);
    expect(kernel.comms[0].sent).toEqual([]);
  });

  it('counts the timeout from the call, probe included', async () => {
    const kernel = new FakeKernel();
    const connection = new KernelConnection(kernel.asKernel(), { timeout: 20 });
    await expect(connection.request({ type: 'dashboard' })).rejects.toThrow(
      'did not answer'
    );
  });

  it('forgets the state when the kernel restarts, and takes the next comm', async () => {
    const { kernel, connection } = connected(fx.session);
    const pending = connection.request({ type: 'detach' });
    await flush();
    kernel.setStatus('restarting');
    await expect(pending).rejects.toThrow('restarted');
    expect(connection.model.attached).toBe(false);
    expect(connection.isOpen).toBe(false);

    kernel.setStatus('idle');
    const again = kernel.openFromKernel(fx.hello);
    again.receive(fx.linkSsh);
    expect(connection.model.attached).toBe(true);
    expect(connection.model.link?.target).toBe('alice@head.example.org');
  });

  it('takes a newer comm from the kernel and closes the older one', async () => {
    const { kernel, comm, connection } = connected([
      fx.hello,
      fx.linkConnected
    ]);
    const pending = connection.request({ type: 'detach' });
    const newer = kernel.openFromKernel(fx.hello);
    expect(comm.closedByPanel).toBe(true);
    await expect(pending).rejects.toThrow('new comm');
    comm.receive(fx.linkLost);
    expect(connection.model.link?.state).toBe('connected');
    newer.receive(fx.linkLost);
    expect(connection.model.link?.state).toBe('lost');
  });

  describe('probe', () => {
    it('opens a comm with the watch command and waits for hello', async () => {
      const kernel = new FakeKernel();
      const connection = new KernelConnection(kernel.asKernel());
      connection.watch(true, 1);
      const probed = connection.probe();
      expect(kernel.comms).toHaveLength(1);
      const comm = kernel.comms[0];
      expect(comm.targetName).toBe(COMM_TARGET);
      expect(comm.opened).toEqual({
        type: 'watch',
        visible: true,
        interval: 1
      });
      comm.receive(fx.hello);
      await probed;
      comm.receive(fx.linkConnected);
      expect(connection.model.attached).toBe(true);
      await connection.probe();
      expect(kernel.comms).toHaveLength(1);
    });

    it('stays not loaded when the kernel refuses the comm', async () => {
      const kernel = new FakeKernel();
      const connection = new KernelConnection(kernel.asKernel());
      const probed = connection.probe();
      kernel.comms[0].closeFromKernel();
      await probed;
      expect(connection.isOpen).toBe(false);
      expect(connection.model.loaded).toBe(false);
      await expect(connection.request({ type: 'dashboard' })).rejects.toThrow(
        NOT_LOADED
      );
      expect(kernel.comms).toHaveLength(1);
    });

    it('lets a request wait for the probe', async () => {
      const kernel = new FakeKernel();
      const connection = new KernelConnection(kernel.asKernel());
      const reply = connection.request({ type: 'dashboard' });
      const comm = kernel.comms[0];
      comm.receive(fx.hello);
      await flush();
      expect(comm.sent).toEqual([{ type: 'dashboard', request: 1 }]);
      comm.receive({
        type: 'reply',
        request: 1,
        ok: true,
        message: 'dashboard',
        outputs: []
      });
      await expect(reply).resolves.toMatchObject({ ok: true, outputs: [] });
    });
  });

  it('lets go of the kernel when disposed', async () => {
    const { kernel, comm, connection } = connected(fx.session);
    const pending = connection.request({ type: 'down' });
    await flush();
    connection.dispose();
    expect(kernel.targets.has(COMM_TARGET)).toBe(false);
    expect(comm.closedByPanel).toBe(true);
    await expect(pending).rejects.toThrow('stopped following');
    expect(connection.isDisposed).toBe(true);
  });

  it('is disposed with its kernel', () => {
    const { kernel, connection } = connected([fx.hello]);
    kernel.isDisposed = true;
    kernel.disposed.emit();
    expect(connection.isDisposed).toBe(true);
  });

  it('interrupts the kernel', async () => {
    const { kernel, connection } = connected([fx.hello]);
    await connection.interrupt();
    expect(kernel.interrupt).toHaveBeenCalledTimes(1);
  });
});
