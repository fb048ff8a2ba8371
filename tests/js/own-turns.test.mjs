import assert from 'node:assert/strict';
import { test } from 'node:test';

import { createOwnTurns } from '../../static/geosense/own-turns.js';

// A tab's own turn arrives twice: on its SSE stream and on its socket. These tests play the
// copies in every order they can physically interleave (a turn's socket copy never starts
// before the request that starts it was sent; each channel keeps its own order) and check
// what the page shows: no socket event of the tab's own turns, every other tab's turn (its
// socket events, or a render from the server when a turn taken wrongly is given back).

/** Every order of several sequences that keeps each one's order and each step's `after`. */
function* interleavings(sequences, done = new Set()) {
  if (sequences.every((sequence) => !sequence.length)) {
    yield [];
    return;
  }
  for (let i = 0; i < sequences.length; i += 1) {
    const [step, ...rest] = sequences[i];
    if (!step || !(step.after ?? []).every((label) => done.has(label))) continue;
    const others = sequences.map((sequence, j) => (j === i ? rest : sequence));
    const now = new Set(done).add(step.label);
    for (const order of interleavings(others, now)) yield [step, ...order];
  }
}

/** A turn's events as one copy carries them. */
function events(turn, deltas) {
  return [
    ['turn_start', { session: 's', turn }],
    ...Array.from({ length: deltas }, (_, i) => ['text_delta', { delta: `${turn}.${i}` }]),
    ['turn_end', {}],
  ];
}

/** This tab's stream `id`: it opens, carries its turn's events, closes (or is refused). */
function stream(id, turn, { deltas = 1, refused = false } = {}) {
  const open = { stream: 'open', id, label: `${id}:open` };
  if (refused) return [open, { stream: 'refused', id, label: `${id}:refused` }];
  return [
    open,
    ...events(turn, deltas).map(([name, data]) => ({ stream: 'event', id, name, data, label: `${id}:${name}` })),
    { stream: 'closed', id, label: `${id}:closed` },
  ];
}

/** The socket's copy of turn `turn` (started by stream `id`, or by another tab: `id` null). */
function copy(turn, { id = null, deltas = 1 } = {}) {
  const whose = id ?? `other${turn}`;
  return events(turn, deltas).map(([name, data]) => ({
    socket: true,
    whose,
    name,
    data,
    label: `${whose}@socket:${name}`,
    after: id ? [`${id}:open`] : [],
  }));
}

/**
 * Play an order. Returns what the page showed of the socket's copies (`whose:event`) and the
 * turns given back to be rendered from the server.
 */
function play(order) {
  const pairing = createOwnTurns();
  const shown = [];
  const givenBack = [];
  const give = (turn) => turn !== null && givenBack.push(turn);
  for (const step of order) {
    if (step.socket) {
      if (!pairing.socketEventIsOwn(step.name, step.data)) shown.push(`${step.whose}:${step.name}`);
    } else if (step.stream === 'open') pairing.streamOpened();
    else if (step.stream === 'event' && step.name === 'turn_start') give(pairing.streamStarted(step.data.turn));
    else if (step.stream === 'closed') give(pairing.streamClosed({ started: true }));
    else if (step.stream === 'refused') give(pairing.streamClosed({ started: false }));
  }
  return { shown, givenBack };
}

function count(sequences, check) {
  let orders = 0;
  for (const order of interleavings(sequences)) {
    check(play(order), order);
    orders += 1;
  }
  return orders;
}

const describe = (order) => order.map((step) => step.label).join(' ');
const own = (shown, id) => shown.filter((entry) => entry.startsWith(`${id}:`));

test('an own turn is shown once, whichever copy arrives first', () => {
  for (const deltas of [0, 1, 2]) {
    const orders = count([stream('A', 1, { deltas }), copy(1, { id: 'A', deltas })], (out, order) => {
      assert.deepEqual(out, { shown: [], givenBack: [] }, describe(order));
    });
    assert.ok(orders >= 10);
  }
});

test('two own turns in a row are each shown once while the socket lags behind', () => {
  const orders = count(
    [[...stream('A', 4), ...stream('B', 5)], [...copy(4, { id: 'A' }), ...copy(5, { id: 'B' })]],
    (out, order) => assert.deepEqual(out, { shown: [], givenBack: [] }, describe(order)),
  );
  assert.ok(orders > 100, `${orders} orders`);
});

test('a resumed turn (the same number twice) is paired with each of its copies', () => {
  count(
    [[...stream('A', 3), ...stream('B', 3)], [...copy(3, { id: 'A' }), ...copy(3, { id: 'B' })]],
    (out, order) => assert.deepEqual(out, { shown: [], givenBack: [] }, describe(order)),
  );
});

test("another tab's turn right after an own one is shown whole, in every order", () => {
  // Turn 7 starts once turn 6 released the session: possibly before this tab's stream has
  // delivered anything, as the socket relays faster than the stream.
  count([stream('A', 6), [...copy(6, { id: 'A' }), ...copy(7)]], (out, order) => {
    assert.deepEqual(out.shown, ['other7:turn_start', 'other7:text_delta', 'other7:turn_end'], describe(order));
    assert.deepEqual(out.givenBack, [], describe(order));
  });
});

test("another tab's turn relayed late, before an own one, is shown or given back", () => {
  // Turn 9 ended before this tab's request claimed the session, but the socket relays it
  // while the request is open: until the stream says "turn 10", turn 9 looks like its own.
  count([stream('A', 10), [...copy(9), ...copy(10, { id: 'A' })]], (out, order) => {
    const renders9 = out.shown.includes('other9:turn_end') || out.givenBack.includes(9);
    assert.ok(renders9, describe(order));
    const labels = order.map((step) => step.label);
    const ambiguous =
      labels.indexOf('other9@socket:turn_start') > labels.indexOf('A:open') &&
      labels.indexOf('other9@socket:turn_start') < labels.indexOf('A:turn_start');
    // Only while it is ambiguous may the own turn's copy show too (it is then re-rendered).
    if (!ambiguous) assert.deepEqual(own(out.shown, 'A'), [], describe(order));
  });
});

test("a refused request gives back another tab's turn it was taken for", () => {
  // This tab sends while another tab's turn 10 runs: the server refuses (409).
  count([stream('A', null, { refused: true }), copy(10, { deltas: 2 })], (out, order) => {
    const renders = out.shown.includes('other10:turn_end') || out.givenBack.includes(10);
    assert.ok(renders, describe(order));
    const refusedAt = order.findIndex((step) => step.stream === 'refused');
    const later = order.slice(refusedAt).filter((step) => step.socket).map((s) => `other10:${s.name}`);
    assert.deepEqual(out.shown.slice(out.shown.length - later.length), later, describe(order));
  });
});

test('a stream lost mid-turn hands the rest of the turn to the socket', () => {
  const pairing = createOwnTurns();
  pairing.streamOpened();
  pairing.streamStarted(11);
  assert.equal(pairing.socketEventIsOwn('turn_start', { turn: 11 }), true);
  assert.equal(pairing.socketEventIsOwn('text_delta', { delta: 'a' }), true);
  pairing.streamLost();
  pairing.streamClosed({ started: true });
  assert.equal(pairing.socketEventIsOwn('text_delta', { delta: 'b' }), false);
  assert.equal(pairing.socketEventIsOwn('turn_end', {}), false);
});

test("a stream lost before its turn's copy started lets the socket show all of it", () => {
  const pairing = createOwnTurns();
  pairing.streamOpened();
  pairing.streamStarted(12);
  pairing.streamLost();
  pairing.streamClosed({ started: true });
  assert.equal(pairing.socketEventIsOwn('turn_start', { turn: 12 }), false);
  assert.equal(pairing.socketEventIsOwn('turn_end', {}), false);
});

test('a socket bound in the middle of a turn follows whether this tab streams one', () => {
  const pairing = createOwnTurns();
  assert.equal(pairing.socketEventIsOwn('text_delta', { delta: 'x' }), false);
  pairing.streamOpened();
  assert.equal(pairing.streaming, true);
  assert.equal(pairing.socketEventIsOwn('text_delta', { delta: 'x' }), true);
  pairing.streamStarted(13);
  pairing.streamClosed({ started: true });
  assert.equal(pairing.streaming, false);
  // No turn_start seen, and the copy of turn 13 is still due: the rest is this tab's.
  assert.equal(pairing.socketEventIsOwn('turn_end', {}), true);
  // That turn_end, seen without its turn_start, clears the due copies.
  assert.equal(pairing.socketEventIsOwn('turn_start', { turn: 14 }), false);
});
