/**
 * The notebook's trainings (`jc.train_torch`) and sweeps (`jc.tune`).
 */

import { formatDuration, formatMetric } from './format';
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

  protected render(model: ClusterModel): void {
    const rows = model.runs.map(run => runRow(run));
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

function runRow(run: IRunState): HTMLElement {
  const row = element('div', `jc-run jc-status-${run.status}`);
  row.dataset.runId = run.id;
  const end = run.finished ?? Date.now() / 1000;
  const main = element('div', 'jc-row-main');
  main.append(
    element('span', 'jc-badge', run.status),
    element('span', 'jc-run-label', run.label),
    element('span', 'jc-tag', run.kind),
    element('span', 'jc-elapsed', formatDuration(end - run.started))
  );
  const detail = [metricText(run), countsText(run.counts)].filter(Boolean);
  row.append(main);
  if (detail.length > 0) {
    row.append(element('div', 'jc-row-detail', detail.join(' · ')));
  }
  return row;
}
