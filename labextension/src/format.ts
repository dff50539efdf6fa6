/**
 * How the sidebar writes numbers: bytes in binary units, durations, clock times.
 * Pure functions; times are seconds, as the kernel sends them.
 */

const BYTE_UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

/** A number with at most `digits` decimals and no trailing zeros: 1.25 → "1.3", 2.0 → "2". */
export function formatNumber(value: number, digits = 1): string {
  return String(Number(value.toFixed(digits)));
}

/** Bytes in binary units: one decimal below 10 of a unit, none above ("1.5 GiB", "512 MiB"). */
export function formatBytes(bytes: number): string {
  let value = Math.max(0, bytes);
  let unit = 0;
  while (value >= 1024 && unit < BYTE_UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  if (unit === 0) {
    return `${Math.round(value)} B`;
  }
  // 1023.6 KiB would print as "1024 KiB": say "1 MiB" instead.
  if (Math.round(value) >= 1024 && unit < BYTE_UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  const text = value < 10 ? formatNumber(value, 1) : String(Math.round(value));
  return `${text} ${BYTE_UNITS[unit]}`;
}

/** A duration: "42s", "3m 07s", "2h 05m". */
export function formatDuration(seconds: number): string {
  const total = Math.max(0, Math.floor(seconds));
  const hours = Math.floor(total / 3600);
  const minutes = Math.floor((total % 3600) / 60);
  const secs = total % 60;
  if (hours > 0) {
    return `${hours}h ${pad(minutes)}m`;
  }
  if (minutes > 0) {
    return `${minutes}m ${pad(secs)}s`;
  }
  return `${secs}s`;
}

/**
 * How long finished work took, as the notebook's own views and results write it (the kernel's
 * `format_duration`): "4.2 s", "3 min 07 s", "2 h 05 min". One duration, one text, wherever it is shown.
 */
export function formatTook(seconds: number): string {
  if (seconds < 60) {
    return `${Math.max(0, seconds).toFixed(1)} s`;
  }
  const total = Math.floor(seconds);
  const minutes = Math.floor(total / 60);
  if (minutes < 60) {
    return `${minutes} min ${pad(total % 60)} s`;
  }
  return `${Math.floor(minutes / 60)} h ${pad(minutes % 60)} min`;
}

/** The local time of day of an epoch time in seconds: "14:02:03". */
export function formatClock(epochSeconds: number): string {
  const date = new Date(epochSeconds * 1000);
  return `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
}

/** A metric's value, short: 0.123456 → "0.123", 12.345 → "12.3", 1234.56 → "1234.6". */
export function formatMetric(value: number): string {
  if (Number.isInteger(value)) {
    return String(value);
  }
  if (Math.abs(value) >= 100) {
    return formatNumber(value, 1);
  }
  return String(Number(value.toPrecision(3)));
}

/** A share in percent of `used` over `total`, between 0 and 100 (0 when total is 0). */
export function percent(used: number, total: number): number {
  if (!(total > 0)) {
    return 0;
  }
  return Math.min(100, Math.max(0, (used / total) * 100));
}

function pad(n: number): string {
  return n < 10 ? `0${n}` : String(n);
}
