import assert from 'node:assert/strict';
import { test } from 'node:test';

import { SOCKET_STATES, createSessionSocket } from '../../static/geosense/socket.js';

// socket.js through its injectable WebSocket and timers: what it sends, in which order, and
// how it answers, refuses, withdraws and reconnects.

class FakeSocket {
  static CONNECTING = 0;
  static OPEN = 1;
  static CLOSED = 3;
  static made = [];

  constructor(url) {
    this.url = url;
    this.readyState = FakeSocket.CONNECTING;
    this.sent = [];
    this.listeners = {};
    FakeSocket.made.push(this);
  }

  addEventListener(type, listener) {
    (this.listeners[type] ??= []).push(listener);
  }

  send(text) {
    this.sent.push(JSON.parse(text));
  }

  close(code = 1000) {
    this.closeWith(code);
  }

  // --- the server's side ---
  open() {
    this.readyState = FakeSocket.OPEN;
    this.emit('open', {});
  }

  receive(frame) {
    this.emit('message', { data: typeof frame === 'string' ? frame : JSON.stringify(frame) });
  }

  closeWith(code) {
    this.readyState = FakeSocket.CLOSED;
    this.emit('close', { code });
  }

  emit(type, event) {
    for (const listener of this.listeners[type] ?? []) listener(event);
  }
}

const LOCATION = {
  declaration: { kind: 'blocking', name: 'location_get', description: 'Where.', arguments: {}, result: {}, serve: true },
  serve: async () => ({ status: 'GRANTED', latitude: 1, longitude: 2, accuracy: 3, timestamp: 4 }),
};
const FOCUS = { declaration: { kind: 'one-way', name: 'map_focus', description: 'Focus.', arguments: {} } };

/** A socket under test with fake timers; `later` holds the scheduled reconnects. */
function harness({ session = 's1', tools = [LOCATION, FOCUS], ...options } = {}) {
  FakeSocket.made = [];
  delete globalThis.geosenseSocketReady;
  const seen = { states: [], events: [], errors: [], bound: [], cancelled: [], later: [] };
  const socket = createSessionSocket({
    url: 'ws://test/ws/chat/',
    session,
    tools: () => tools,
    WebSocket: FakeSocket,
    onState: (state) => seen.states.push(state),
    onEvent: (name, data) => seen.events.push([name, data]),
    onFrameError: (frame) => seen.errors.push(frame),
    onBound: (id) => seen.bound.push(id),
    onCancelled: (call) => seen.cancelled.push(call),
    setTimeout: (fn, ms) => seen.later.push({ fn, ms }) - 1,
    clearTimeout: () => {},
    ...options,
  });
  return { socket, seen, ws: () => FakeSocket.made.at(-1) };
}

const tick = () => new Promise((resolve) => setImmediate(resolve));

test('on open it binds the session, registers its tools once bound, then is ready', () => {
  const { seen, ws } = harness();
  ws().open();
  assert.deepEqual(ws().sent, [{ type: 'session-bind', session: 's1' }]);
  ws().receive({ type: 'session-bound', session: 's1' });
  assert.deepEqual(ws().sent[1], {
    type: 'client-tool-register',
    tools: [LOCATION.declaration, FOCUS.declaration],
  });
  assert.deepEqual(seen.bound, ['s1']);
  assert.notEqual(globalThis.geosenseSocketReady, true);
  ws().receive({ type: 'client-tool-registered', tools: ['location_get', 'map_focus'] });
  assert.equal(globalThis.geosenseSocketReady, true);
  assert.deepEqual(seen.states, ['connecting', 'connected']);
  assert.ok(Object.keys(SOCKET_STATES).includes('offline'));
});

test('a session-bound for a session it no longer wants registers nothing', () => {
  const { socket, ws } = harness();
  ws().open();
  socket.bind('s2');
  ws().receive({ type: 'session-bound', session: 's1' });
  assert.deepEqual(ws().sent.map((f) => f.type), ['session-bind', 'session-bind']);
  assert.equal(ws().sent[1].session, 's2');
});

test('without a session it registers nothing and says connected', () => {
  const { seen, ws } = harness({ session: null });
  ws().open();
  assert.deepEqual(ws().sent, []);
  assert.deepEqual(seen.states, ['connecting', 'connected']);
});

test('an invoke is answered with what the tool serves', async () => {
  const { ws } = harness();
  ws().open();
  ws().receive({ type: 'client-tool-invoke', correlationId: 'c1', name: 'location_get', arguments: {} });
  await tick();
  assert.deepEqual(ws().sent.at(-1), {
    type: 'client-tool-result',
    correlationId: 'c1',
    result: { status: 'GRANTED', latitude: 1, longitude: 2, accuracy: 3, timestamp: 4 },
  });
});

test('a throwing tool, or one the page does not serve, answers a readable error', async () => {
  const failing = {
    declaration: { ...LOCATION.declaration, name: 'map_get_view' },
    serve: () => {
      throw new Error('the map is not ready');
    },
  };
  const { ws } = harness({ tools: [failing, FOCUS] });
  ws().open();
  ws().receive({ type: 'client-tool-invoke', correlationId: 'c1', name: 'map_get_view', arguments: {} });
  ws().receive({ type: 'client-tool-invoke', correlationId: 'c2', name: 'map_focus', arguments: {} });
  ws().receive({ type: 'client-tool-invoke', correlationId: 'c3', name: 'teleport', arguments: {} });
  await tick();
  assert.deepEqual(ws().sent.slice(1), [
    { type: 'client-tool-result', correlationId: 'c1', error: 'the map is not ready' },
    { type: 'client-tool-result', correlationId: 'c2', error: 'this page does not answer map_focus by itself' },
    { type: 'client-tool-result', correlationId: 'c3', error: 'this page does not answer teleport by itself' },
  ]);
});

test('a call the server withdraws is aborted and never answered', async () => {
  let release;
  let signal;
  const slow = {
    declaration: LOCATION.declaration,
    serve: (args, options) => {
      signal = options.signal;
      return new Promise((resolve) => {
        release = resolve;
      });
    },
  };
  const { seen, ws } = harness({ tools: [slow] });
  ws().open();
  ws().receive({ type: 'client-tool-invoke', correlationId: 'c9', name: 'location_get', arguments: {} });
  await tick();
  assert.equal(signal.aborted, false);
  ws().receive({ type: 'client-tool-cancelled', correlationId: 'c9' });
  assert.equal(signal.aborted, true);
  assert.deepEqual(seen.cancelled, [{ correlationId: 'c9', name: 'location_get' }]);
  release({ status: 'PENDING', message: 'late' });
  await tick();
  assert.deepEqual(ws().sent.map((f) => f.type), ['session-bind']);
  ws().receive({ type: 'client-tool-cancelled', correlationId: 'unknown' });
  assert.equal(seen.cancelled.length, 1);
});

test('a call still open when the socket closes is not answered on the next socket', async () => {
  let release;
  const slow = { declaration: LOCATION.declaration, serve: () => new Promise((resolve) => (release = resolve)) };
  const { seen, ws } = harness({ tools: [slow] });
  const first = ws();
  first.open();
  first.receive({ type: 'client-tool-invoke', correlationId: 'c1', name: 'location_get', arguments: {} });
  first.closeWith(1006);
  seen.later.shift().fn();
  ws().open();
  release({ status: 'DECLINED', message: 'no' });
  await tick();
  assert.notEqual(ws(), first);
  assert.deepEqual(ws().sent, [{ type: 'session-bind', session: 's1' }]);
});

test('events and error frames reach their callbacks; junk frames are ignored', () => {
  const { seen, ws } = harness();
  ws().open();
  ws().receive({ type: 'event', event: 'text_delta', data: { delta: 'Hi' } });
  ws().receive({ type: 'error', status: 404, error: 'session not found' });
  ws().receive('not json');
  ws().receive({ type: 'unheard-of' });
  assert.deepEqual(seen.events, [['text_delta', { delta: 'Hi' }]]);
  assert.deepEqual(seen.errors, [{ type: 'error', status: 404, error: 'session not found' }]);
});

test('a lost socket reconnects with a growing back-off, binds and registers again', () => {
  const { seen, ws } = harness();
  ws().open();
  ws().receive({ type: 'session-bound', session: 's1' });
  ws().receive({ type: 'client-tool-registered', tools: [] });
  for (let i = 0; i < 5; i += 1) {
    ws().closeWith(1006);
    const { fn, ms } = seen.later.shift();
    assert.equal(ms, [500, 1000, 2000, 4000, 8000][i]);
    fn();
  }
  assert.equal(FakeSocket.made.length, 6);
  // After three failed attempts a close says offline; each new attempt says reconnecting.
  assert.deepEqual(seen.states.slice(-4), ['offline', 'reconnecting', 'offline', 'reconnecting']);
  ws().open();
  assert.deepEqual(ws().sent, [{ type: 'session-bind', session: 's1' }]);
  ws().receive({ type: 'session-bound', session: 's1' });
  assert.equal(ws().sent[1].type, 'client-tool-register');
  assert.equal(globalThis.geosenseSocketReady, false);
});

test('an unauthenticated close (4401) stops reconnecting and says offline', () => {
  const { seen, ws } = harness();
  ws().open();
  ws().closeWith(4401);
  assert.deepEqual(seen.later, []);
  assert.equal(seen.states.at(-1), 'offline');
});

test('a live-lost close (4503) shows the stored transcript at once, then reconnects', () => {
  let lost = 0;
  const { seen, ws } = harness({ onLiveLost: () => { lost += 1; } });
  ws().open();
  ws().receive({ type: 'session-bound', session: 's1' });
  ws().closeWith(4503);
  assert.equal(lost, 1);
  assert.equal(seen.later.length, 1);
  seen.later.shift().fn();
  ws().open();
  assert.deepEqual(ws().sent, [{ type: 'session-bind', session: 's1' }]);
  ws().closeWith(1006);
  assert.equal(lost, 1);
});

test('close() stops it for good', () => {
  const { socket, seen, ws } = harness();
  ws().open();
  socket.close();
  assert.equal(ws().readyState, FakeSocket.CLOSED);
  assert.deepEqual(seen.later, []);
});

test('bind() on an open socket binds the new session at once; closed, it waits for open', () => {
  const { socket, seen, ws } = harness({ session: null });
  socket.bind('s3');
  assert.deepEqual(ws().sent, []);
  ws().open();
  assert.deepEqual(ws().sent, [{ type: 'session-bind', session: 's3' }]);
  socket.bind('s4');
  assert.deepEqual(ws().sent.at(-1), { type: 'session-bind', session: 's4' });
  assert.equal(seen.states.at(-1), 'connecting');
});

test('an annotations-changed frame is handed on with its revision', () => {
  const changed = [];
  const { ws } = harness({ onAnnotationsChanged: (revision) => changed.push(revision) });
  ws().open();
  ws().receive({ type: 'annotations-changed', revision: 'r2' });
  assert.deepEqual(changed, ['r2']);
});

test('bind() resolves once the new session has the tools; a first message waits for it', async () => {
  const { socket, ws } = harness({ session: null });
  ws().open();
  let ready = false;
  socket.bind('s2').then(() => {
    ready = true;
  });
  ws().receive({ type: 'session-bound', session: 's2' });
  await tick();
  assert.equal(ready, false);
  ws().receive({ type: 'client-tool-registered', tools: ['location_get', 'map_focus'] });
  await tick();
  assert.equal(ready, true);
});

test('bind() gives up waiting after its time limit, and at once when the socket closes', async () => {
  const { socket, seen, ws } = harness({ session: null });
  ws().open();
  let ready = false;
  socket.bind('s2').then(() => {
    ready = true;
  });
  seen.later.at(-1).fn();
  await tick();
  assert.equal(ready, true);
  let closed = false;
  socket.bind('s3').then(() => {
    closed = true;
  });
  ws().closeWith(1006);
  await tick();
  assert.equal(closed, true);
});

test('bound to no session (a new conversation), the old session\'s events are dropped', () => {
  const { socket, seen, ws } = harness();
  ws().open();
  ws().receive({ type: 'session-bound', session: 's1' });
  socket.bind(null);
  ws().receive({ type: 'event', event: 'text_delta', data: { delta: 'old' } });
  assert.deepEqual(seen.events, []);
  assert.equal(ws().sent.filter((f) => f.type === 'session-bind').length, 1);
});
