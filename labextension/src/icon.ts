/**
 * The sidebar's icon: three linked nodes.
 */

import { LabIcon } from '@jupyterlab/ui-components';

const svgstr = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <circle cx="12" cy="4.5" r="3"/>
    <circle cx="4.5" cy="18" r="3"/>
    <circle cx="19.5" cy="18" r="3"/>
    <path d="M11 7h2v3.2l4.9 5.4-1.5 1.3L12 12.1l-4.4 4.8-1.5-1.3L11 10.2z"/>
  </g>
</svg>`;

export const clusterIcon = new LabIcon({
  name: 'jupyter-cluster:cluster',
  svgstr
});
