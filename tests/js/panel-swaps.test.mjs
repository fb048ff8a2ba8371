import assert from 'node:assert/strict';
import { test } from 'node:test';

import { guardPanelSwaps } from '../../static/geosense/panel-swaps.js';

// htmx's events as page.js receives them on the body: the same detail object for a request's
// beforeSwap as htmx builds it (its `xhr` is the request's).
function htmx(body, name, detail) {
  const event = new Event(name);
  event.detail = detail;
  body.dispatchEvent(event);
  return detail;
}

function panelRequest(body, target = { id: 'chat-panel' }) {
  const xhr = {};
  htmx(body, 'htmx:beforeRequest', { target, xhr });
  return () => htmx(body, 'htmx:beforeSwap', { target, xhr, shouldSwap: true }).shouldSwap;
}

test('a panel asked for before the reader sent is not swapped in', () => {
  const body = new EventTarget();
  const guard = guardPanelSwaps({ body });
  const answer = panelRequest(body);
  guard.acted();
  assert.equal(answer(), false);
});

test('a panel asked for after the reader sent is swapped in (the click is the last act)', () => {
  const body = new EventTarget();
  const guard = guardPanelSwaps({ body });
  guard.acted();
  const answer = panelRequest(body);
  assert.equal(answer(), true);
});

test('with no send in between, every panel is swapped in, each request on its own', () => {
  const body = new EventTarget();
  const guard = guardPanelSwaps({ body });
  const first = panelRequest(body);
  guard.acted();
  const second = panelRequest(body);
  assert.equal(second(), true);
  assert.equal(first(), false);
});

test('swaps of other targets (the list, the header) and unknown requests are left alone', () => {
  const body = new EventTarget();
  const guard = guardPanelSwaps({ body });
  const list = panelRequest(body, { id: 'sessions' });
  guard.acted();
  assert.equal(list(), true);
  const unknown = htmx(body, 'htmx:beforeSwap', {
    target: { id: 'chat-panel' },
    xhr: {},
    shouldSwap: true,
  });
  assert.equal(unknown.shouldSwap, true);
});

test('text typed while a panel loads is carried into it, once; text left before is not', () => {
  const body = new EventTarget();
  let text = 'an old draft';
  const guard = guardPanelSwaps({ body, draft: () => text });
  const untouched = panelRequest(body);
  assert.equal(untouched(), true);
  assert.equal(guard.takeDraft(), '');
  const typedInto = panelRequest(body);
  text = 'how many trees';
  assert.equal(typedInto(), true);
  assert.equal(guard.takeDraft(), 'how many trees');
  assert.equal(guard.takeDraft(), '');
});
