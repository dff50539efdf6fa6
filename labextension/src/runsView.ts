/**
 * The notebook's trainings (`jc.train_torch`) and sweeps (`jc.tune`).
 */

import { formatDuration, formatMetric, formatTook } from './format';
import { IRunState } from './messages';
import { ClusterModel } from './model';
import { SectionView, element, emptyLine } from './section';

/** How Ray's trial and worker states read in a count. */
const STATE_WORDS: { [state: string]: string } = {
  terminated: 'done',
  error: 'errored'
};

/**
 * One row per run: label, kind, status, its best (or last) metric, how many trials or
 * workers are in each state, and how long it ran.
 */
export class RunsView extends SectionView {
  constructor() {
    super('runs', 'Trainings and sweeps', ['runs']);
  }

  private _clocks: { node: HTMLElement; since: number }[] = [];

  protected render(model: ClusterModel): void {
    this._clocks = [];
    const rows = model.runs.map(run => runRow(run, this._clocks));
    // A running run's time goes on between the kernel's messages (a training reports only now and then).
    this.setClock(
      this._clocks.length > 0
        ? () => {
            const t = Date.now() / 1000;
            for (const clock of this._clocks) {
              clock.node.textContent = formatDuration(t - clock.since);
            }
          }
        : null
    );
    this.body.replaceChildren(
      ...(rows.length > 0
        ? rows
        : [emptyLine('No runs: jc.train_torch and jc.tune show here.')])
    );
  }
}

/** "best loss 0.123 (min)" for a sweep, "last loss 0.123" for a training, or "". */
export function metricText(run: IRunState): string {
  if (run.metric === null || run.best === null) {
    return '';
  }
  const value = run.best_text ?? formatMetric(run.best);
  if (run.kind === 'train') {
    return `last ${run.metric} ${value}`;
  }
  return `best ${run.metric} ${value}${run.mode !== null ? ` (${run.mode})` : ''}`;
}

/** "4 running · 2 done · 1 errored", in the kernel's order, zeros left out. */
export function countsText(counts: { [state: string]: number }): string {
  return Object.entries(counts)
    .filter(([, n]) => n > 0)
    .map(([state, n]) => `${n} ${STATE_WORDS[state] ?? state}`)
    .join(' · ');
}

function runRow(
  run: IRunState,
  clocks: { node: HTMLElement; since: number }[]
): HTMLElement {
  const row = element('div', `jc-run jc-status-${run.status}`);
  row.dataset.runId = run.id;
  const end = run.finished ?? Date.now() / 1000;
  // Running: a clock; ended: its run time, as the run's widget and result write it.
  const elapsed = element(
    'span',
    'jc-elapsed',
    run.finished !== null
      ? formatTook(end - run.started)
      : formatDuration(end - run.started)
  );
  if (run.finished === null) {
    clocks.push({ node: elapsed, since: run.started });
  }
  const main = element('div', 'jc-row-main');
  main.append(
    element('span', 'jc-badge', run.status),
    element('span', 'jc-run-label', run.label),
    element('span', 'jc-tag', run.kind),
    elapsed
  );
  const detail = [metricText(run), countsText(run.counts)].filter(Boolean);
  row.append(main);
  if (detail.length > 0) {
    row.append(element('div', 'jc-row-detail', detail.join(' · ')));
  }
  return row;
}
