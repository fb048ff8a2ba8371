import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import { FORMATTERS, formatLinkValue } from '../../static/geosense/format.js';

// The table of cases chat/markup/formatting.py formats too (tests/chat/test_formatting.py,
// which also runs thousands of generated values through both sides).
const CASES = JSON.parse(readFileSync(new URL('../formatting_cases.json', import.meta.url), 'utf8'));

test('the page formats each case of the shared table as the server does', () => {
  assert.ok(CASES.length > 100);
  for (const { format, value, text } of CASES) {
    assert.equal(FORMATTERS[format](value), text, `${format}(${JSON.stringify(value)})`);
  }
});

test('every formatter of the page is in the table', () => {
  assert.deepEqual(Object.keys(FORMATTERS).sort(), [...new Set(CASES.map((c) => c.format))].sort());
});

test('link values follow the link type', () => {
  assert.equal(formatLinkValue('distance', 4.3), '4.3 m');
  assert.equal(formatLinkValue('overlap', 0.42), '42%');
  assert.equal(formatLinkValue('other', 3.14159), '3.14');
  assert.equal(formatLinkValue('other', 'x'), '—');
});
