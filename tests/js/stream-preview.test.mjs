import assert from 'node:assert/strict';
import { test } from 'node:test';

import { PREVIEW_INTERVAL_MS, createStreamPreview } from '../../static/geosense/stream-preview.js';

/** A fake clock and server: requests resolve only when the test says so. */
function harness({ status = 200 } = {}) {
  let clock = 0;
  const timers = [];
  const requests = [];
  const shown = [];
  const preview = createStreamPreview({
    url: '/chat/s/preview/',
    headers: { 'X-CSRFToken': 't' },
    render: (html) => shown.push(['html', html]),
    fallback: (text) => shown.push(['text', text]),
    now: () => clock,
    setTimeout: (fn, ms) => {
      const timer = { fn, at: clock + ms, done: false };
      timers.push(timer);
      return timer;
    },
    clearTimeout: (timer) => {
      timer.done = true;
    },
    fetch: (url, options) =>
      new Promise((resolve) => {
        const text = JSON.parse(options.body).text;
        requests.push({
          url,
          options,
          text,
          answer: () => resolve({ ok: status === 200, status, text: async () => `<p>${text}</p>` }),
        });
      }),
  });
  const settle = () => new Promise((resolve) => setImmediate(resolve));
  return {
    preview,
    requests,
    shown,
    settle,
    async tick(ms) {
      clock += ms;
      for (const timer of timers.filter((t) => !t.done && t.at <= clock)) {
        timer.done = true;
        timer.fn();
      }
      await settle();
    },
  };
}

test('the first text is sent at once with the CSRF header, and its HTML is shown', async () => {
  const h = harness();
  h.preview.update('**Tre');
  await h.tick(0);
  assert.equal(h.requests.length, 1);
  assert.equal(h.requests[0].url, '/chat/s/preview/');
  assert.equal(h.requests[0].options.method, 'POST');
  assert.equal(h.requests[0].options.headers['X-CSRFToken'], 't');
  h.requests[0].answer();
  await h.settle();
  assert.deepEqual(h.shown, [['html', '<p>**Tre</p>']]);
});

test('one request at a time, and the newest text follows the one in flight', async () => {
  const h = harness();
  h.preview.update('a');
  await h.tick(0);
  h.preview.update('ab');
  h.preview.update('abc');
  await h.tick(PREVIEW_INTERVAL_MS * 3);
  assert.equal(h.requests.length, 1);
  h.requests[0].answer();
  await h.settle();
  await h.tick(PREVIEW_INTERVAL_MS);
  assert.deepEqual(
    h.requests.map((r) => r.text),
    ['a', 'abc'],
  );
});

test('requests start at most once per interval', async () => {
  const h = harness();
  h.preview.update('a');
  await h.tick(0);
  h.requests[0].answer();
  await h.settle();
  h.preview.update('ab');
  await h.tick(PREVIEW_INTERVAL_MS / 2);
  assert.equal(h.requests.length, 1);
  await h.tick(PREVIEW_INTERVAL_MS / 2);
  assert.equal(h.requests.length, 2);
});

test('nothing is shown after close, even a preview already on its way', async () => {
  const h = harness();
  h.preview.update('a');
  await h.tick(0);
  h.preview.close();
  h.requests[0].answer();
  await h.settle();
  h.preview.update('ab');
  await h.tick(PREVIEW_INTERVAL_MS);
  assert.deepEqual(h.shown, []);
  assert.equal(h.requests.length, 1);
});

test('when the server cannot render, the text is shown plain for the rest of the stream', async () => {
  const h = harness({ status: 413 });
  h.preview.update('x');
  await h.tick(0);
  h.requests[0].answer();
  await h.settle();
  h.preview.update('xy');
  await h.tick(PREVIEW_INTERVAL_MS);
  assert.deepEqual(h.shown, [
    ['text', 'x'],
    ['text', 'xy'],
  ]);
  assert.equal(h.requests.length, 1);
});
