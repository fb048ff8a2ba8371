import assert from 'node:assert/strict';
import { test } from 'node:test';

import { dayLabel, relativeTime } from '../../static/geosense/sessions-list.js';

// Local times, so the tests hold in any time zone: days are the reader's own.
const NOW = new Date(2026, 10, 30, 14, 30); // Monday 30 Nov 2026, 14:30

test('days read as Today, Yesterday, a weekday within the week, then dates', () => {
  assert.equal(dayLabel(new Date(2026, 10, 30, 0, 1), NOW), 'Today');
  assert.equal(dayLabel(new Date(2026, 10, 29, 23, 59), NOW), 'Yesterday');
  assert.equal(dayLabel(new Date(2026, 10, 25, 9, 0), NOW), 'Wednesday');
  assert.equal(dayLabel(new Date(2026, 10, 23, 9, 0), NOW), '23 Nov');
  assert.equal(dayLabel(new Date(2025, 11, 31, 9, 0), NOW), '31 Dec 2025');
});

test('a time is relative today and the clock time on other days', () => {
  assert.equal(relativeTime(new Date(2026, 10, 30, 14, 29, 40), NOW), 'just now');
  assert.equal(relativeTime(new Date(2026, 10, 30, 14, 5), NOW), '25 min ago');
  assert.equal(relativeTime(new Date(2026, 10, 30, 9, 10), NOW), '5 h ago');
  assert.equal(relativeTime(new Date(2026, 10, 29, 23, 59), NOW), '23:59');
  assert.equal(relativeTime(new Date(2026, 10, 2, 8, 5), NOW), '08:05');
});

test('a time slightly ahead of the clock (another machine) is "just now"', () => {
  assert.equal(relativeTime(new Date(2026, 10, 30, 14, 31), NOW), 'just now');
});
