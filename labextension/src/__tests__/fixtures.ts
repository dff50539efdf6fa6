/**
 * Kernel messages as `jupyter_cluster/_sidebar.py` sends them, recorded from an embedded
 * local cluster and an SSH one (times and addresses kept, ids shortened).
 */

import {
  IActorsMessage,
  ICellsMessage,
  IForwardsMessage,
  IHelloMessage,
  ILinkMessage,
  ILinkState,
  INodesMessage,
  IRunsMessage,
  KernelMessage
} from '../messages';

/** 2024-05-14 09:26:40 UTC: the recordings' clock. */
export const T0 = 1715678800;

const GiB = 2 ** 30;
const MiB = 2 ** 20;

export const hello: IHelloMessage = {
  type: 'hello',
  version: 1,
  package_version: '0.1.0'
};

const local: ILinkState = {
  state: 'connected',
  kind: 'embedded local',
  target: '/tmp/jupyter_cluster-0/agent.sock',
  session: 'local-3f2a',
  rtt: 0.0123,
  since: null,
  attempts: 0,
  last_error: '',
  error: null,
  ray: '2.49.1',
  python: '3.11.7',
  ray_dashboard: null
};

export const linkConnected: ILinkMessage = { type: 'link', link: local };

export const linkSsh: ILinkMessage = {
  type: 'link',
  link: {
    ...local,
    kind: 'ssh alice@head.example.org',
    target: 'alice@head.example.org',
    session: 'ssh-91c0',
    rtt: 0.0412,
    ray_dashboard: 'http://127.0.0.1:41235'
  }
};

export const linkReconnecting: ILinkMessage = {
  type: 'link',
  link: {
    ...linkSsh.link!,
    state: 'reconnecting',
    rtt: null,
    since: T0,
    attempts: 3,
    last_error: 'ConnectionRefusedError: [Errno 111] Connect call failed'
  }
};

export const linkLost: ILinkMessage = {
  type: 'link',
  link: {
    ...linkSsh.link!,
    state: 'lost',
    rtt: null,
    error: 'gave up after 600 s: the head does not answer'
  }
};

export const linkNone: ILinkMessage = { type: 'link', link: null };

export const nodes: INodesMessage = {
  type: 'nodes',
  t: T0 + 5,
  age: 0.5,
  nodes: [
    {
      id: 'a1b2c3',
      address: '10.0.0.1',
      head: true,
      alive: true,
      cpu: { used: 1.2, total: 4 },
      gpu: null,
      gram: null,
      ram: { used: 512 * MiB, total: 2 * GiB },
      store: { used: 0, total: 1 * GiB }
    },
    {
      id: 'd4e5f6',
      address: '10.0.0.2',
      head: false,
      alive: true,
      cpu: { used: 8, total: 8 },
      gpu: { used: 1.5, total: 2 },
      gram: { used: 6 * GiB, total: 32 * GiB },
      ram: { used: 30 * GiB, total: 32 * GiB },
      store: { used: 1.5 * GiB, total: 8 * GiB }
    },
    {
      id: '0a9b8c',
      address: '10.0.0.3',
      head: false,
      alive: false,
      cpu: { used: 0, total: 4 },
      gpu: null,
      gram: null,
      ram: { used: 0, total: 16 * GiB },
      store: { used: 0, total: 0 }
    }
  ]
};

export const cells: ICellsMessage = {
  type: 'cells',
  cells: [
    {
      id: 'c-map',
      label: 'Cell In[7]',
      mode: 'map',
      where: 'map',
      node: null,
      status: 'running',
      submitted: T0 - 42,
      finished: null,
      progress: [3, 8],
      tasks_running: 2,
      foreground: false
    },
    {
      id: 'c-fg',
      label: 'Cell In[6]',
      mode: 'task',
      where: 'task',
      node: '10.0.0.2',
      status: 'running',
      submitted: T0 - 5,
      finished: null,
      progress: null,
      foreground: true
    },
    {
      id: 'c-queued',
      label: 'Cell In[5]',
      mode: 'actor',
      where: 'actor counter',
      node: null,
      status: 'queued',
      submitted: T0 - 2,
      finished: null,
      progress: null,
      foreground: false
    },
    {
      id: 'c-done',
      label: 'Cell In[4]',
      mode: 'driver',
      where: 'driver',
      node: '10.0.0.1',
      status: 'done',
      submitted: T0 - 200,
      finished: T0 - 13,
      progress: null,
      foreground: false
    },
    {
      id: 'c-failed',
      label: 'jc.tune(train)',
      mode: 'driver',
      where: 'driver',
      node: '10.0.0.1',
      status: 'failed',
      submitted: T0 - 400,
      finished: T0 - 395,
      progress: null,
      foreground: false
    }
  ]
};

export const actors: IActorsMessage = {
  type: 'actors',
  actors: [
    { name: 'counter', node: '10.0.0.2', running: 'c-queued', error: null },
    {
      name: 'model',
      node: null,
      running: null,
      error: 'The actor died: its node 10.0.0.3 left the cluster'
    }
  ]
};

export const runs: IRunsMessage = {
  type: 'runs',
  runs: [
    {
      id: 'c-tune',
      kind: 'tune',
      label: 'jc.tune(train)',
      status: 'running',
      metric: 'loss',
      mode: 'min',
      best: 0.123456,
      best_text: '0.1235',
      counts: { running: 4, terminated: 2, error: 1, pending: 0 },
      started: T0 - 125,
      finished: null,
      cell: 'c-tune'
    },
    {
      id: 'c-train',
      kind: 'train',
      label: 'jc.train_torch(train_func)',
      status: 'done',
      metric: 'accuracy',
      mode: null,
      best: 0.9312,
      counts: { running: 2 },
      started: T0 - 900,
      finished: T0 - 300,
      cell: 'c-train'
    }
  ]
};

export const forwards: IForwardsMessage = {
  type: 'forwards',
  forwards: [
    {
      name: 'Ray dashboard',
      local: 'http://127.0.0.1:41235',
      remote: 'head:8265'
    }
  ]
};

/** What a panel gets on a fresh comm to an attached kernel, in order. */
export const session: KernelMessage[] = [
  hello,
  linkConnected,
  cells,
  actors,
  runs,
  forwards,
  nodes
];
