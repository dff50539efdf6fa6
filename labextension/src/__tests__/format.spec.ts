import {
  formatBytes,
  formatClock,
  formatDuration,
  formatTook,
  formatMetric,
  formatNumber,
  percent
} from '../format';

describe('formatBytes', () => {
  it.each([
    [0, '0 B'],
    [1023, '1023 B'],
    [1024, '1 KiB'],
    [1536, '1.5 KiB'],
    [512 * 2 ** 20, '512 MiB'],
    [2 * 2 ** 30, '2 GiB'],
    [1.25 * 2 ** 30, '1.3 GiB'],
    [10.4 * 2 ** 30, '10 GiB'],
    [1023.7 * 2 ** 20, '1 GiB'],
    [3 * 2 ** 40, '3 TiB'],
    [-5, '0 B']
  ])('writes %p bytes as %p', (bytes, text) => {
    expect(formatBytes(bytes)).toBe(text);
  });
});

describe('formatTook', () => {
  it.each([
    [4.24, '4.2 s'],
    [0, '0.0 s'],
    [187.5, '3 min 07 s'],
    [7500, '2 h 05 min']
  ])('%p seconds: %p, as the kernel writes it', (seconds, text) => {
    expect(formatTook(seconds)).toBe(text);
  });
});

describe('formatDuration', () => {
  it.each([
    [0, '0s'],
    [42.9, '42s'],
    [187, '3m 07s'],
    [600, '10m 00s'],
    [7500, '2h 05m'],
    [-3, '0s']
  ])('writes %p s as %p', (seconds, text) => {
    expect(formatDuration(seconds)).toBe(text);
  });
});

describe('formatClock', () => {
  it('writes the local time of day with seconds', () => {
    const t = new Date(2024, 4, 14, 9, 3, 7).getTime() / 1000;
    expect(formatClock(t)).toBe('09:03:07');
  });
});

describe('formatMetric', () => {
  it.each([
    [0.123456, '0.123'],
    [12.345, '12.3'],
    [1234.56, '1234.6'],
    [0.000123456, '0.000123'],
    [3, '3'],
    [-0.5, '-0.5']
  ])('writes %p as %p', (value, text) => {
    expect(formatMetric(value)).toBe(text);
  });
});

describe('formatNumber and percent', () => {
  it('keeps one decimal without trailing zeros', () => {
    expect(formatNumber(1.25)).toBe('1.3');
    expect(formatNumber(4)).toBe('4');
    expect(formatNumber(0.04)).toBe('0');
  });

  it('clamps shares to 0..100 and treats an empty total as 0', () => {
    expect(percent(1, 4)).toBe(25);
    expect(percent(5, 4)).toBe(100);
    expect(percent(5, 0)).toBe(0);
    expect(percent(-1, 4)).toBe(0);
  });
});
