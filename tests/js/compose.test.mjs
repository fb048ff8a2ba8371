import assert from 'node:assert/strict';
import { test } from 'node:test';

import { composeAnswer, composeResponse } from '../../static/geosense/compose.js';

test('an option answer carries its 0-based index and the escaped message', () => {
  assert.equal(
    composeAnswer('q-1', 0, '  Yes & <go> "now"  '),
    '<answer question="q-1" question-option-index="0">Yes &amp; &lt;go&gt; "now"</answer>',
  );
});

test('an answer in own words has no index', () => {
  assert.equal(composeAnswer('q-big', null, 'the pools'), '<answer question="q-big">the pools</answer>');
});

test('an answer names the message that asked its question', () => {
  assert.equal(
    composeAnswer('q-view', 1, 'No', '41'),
    '<answer question="q-view" question-option-index="1" asked-in="41">No</answer>',
  );
});

test('a question id cannot end its attribute', () => {
  assert.equal(
    composeAnswer('a" onclick="x', 1, 'ok'),
    '<answer question="a&quot; onclick=&quot;x" question-option-index="1">ok</answer>',
  );
});

test('the find-similar response counts its results in words', () => {
  assert.equal(
    composeResponse('pool', 'fs-1', 1),
    '<response type="find_similar" class-id="pool" request="fs-1">' +
      'Find Similar located 1 result belonging to class pool.</response>',
  );
  assert.match(composeResponse('pool', 'fs-1', 3), /located 3 results belonging/);
});
