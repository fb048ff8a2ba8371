import assert from 'node:assert/strict';
import { test } from 'node:test';

import { previewText } from '../../static/geosense/live-turn.js';

test('a streaming preview leaves tags out, a half-written one at the end too', () => {
  assert.equal(previewText('Trees within <distance value="20" /> of a house'), 'Trees within  of a house');
  assert.equal(previewText('I found <tool type="highl'), 'I found ');
  assert.equal(previewText('<question id="q"><header>Which?</header>'), 'Which?');
});

test('a streaming preview shows placeholders as an ellipsis, a half-written one too', () => {
  assert.equal(previewText('The closest is ${within-1.ids.0} and ${with'), 'The closest is … and …');
});
