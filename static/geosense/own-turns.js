// Which of the socket's turn events this tab has already shown from its own stream.
//
// A tab follows the turns it starts (or resumes) over their own SSE stream, and its session
// socket relays every turn of the session too, its own included: the same events arrive
// twice, in either order. The socket's copy may start before the stream says turn_start, or
// only after the stream has ended; another tab's turn may be relayed while this tab's request
// is still open. This module pairs the two copies so that the page shows each event once: the
// stream's copy of this tab's turns, the socket's copy of everyone else's. Where the order
// leaves it ambiguous for a moment (a socket turn starts before the stream has said which turn
// is its own), it guesses "own" and, once the stream tells, gives back a turn it took wrongly
// so the page renders it from the server. Pure state, no DOM, no timers:
// tests/js/own-turns.test.mjs plays every order the two copies can arrive in.

/**
 * @typedef {object} OwnTurns
 * @property {boolean} streaming this tab follows a stream of its own right now
 * @property {() => void} streamOpened the tab sent a request that may start or resume a turn
 * @property {(turn: number) => number | null} streamStarted the stream announced its turn;
 *   returns a turn taken for it wrongly (render it from the server), else null
 * @property {(outcome: {started: boolean}) => number | null} streamClosed the stream ended
 *   (`started` false: refused or unreachable); returns a turn taken for it wrongly, else null
 * @property {() => void} streamLost the stream broke off mid-turn: the socket shows the rest
 * @property {(name: string, data: object) => boolean} socketEventIsOwn true when this socket
 *   event belongs to a turn the tab shows from its own stream (skip it)
 */

/** @returns {OwnTurns} */
export function createOwnTurns() {
  let streams = 0;
  // The open stream: its announced turn (null until turn_start), whether its copy on the
  // socket has started, and a socket turn taken for it before it announced its own.
  let stream = null;
  // Turns of this tab's streams whose copy on the socket has not started yet, oldest first.
  let echoes = [];
  let socketTurn = null; // {turn, own}: the turn the socket's events belong to

  /** A socket turn taken for the open stream was someone else's: show its rest. */
  function giveBack(turn) {
    if (socketTurn?.turn === turn) socketTurn.own = false;
    return turn;
  }

  function socketTurnStarts(turn) {
    // Echoes that never came (the socket was away during that stream) are older turns.
    echoes = echoes.filter((echo) => echo.turn >= turn);
    if (echoes[0]?.turn === turn) {
      const echo = echoes.shift();
      if (stream && echo.stream === stream.id) stream.echoed = true;
      return true;
    }
    if (stream && !stream.echoed && (stream.turn === null || stream.turn === turn)) {
      // The socket's copy overtook the stream: take it for the stream's own until it says.
      stream.echoed = true;
      if (stream.turn === null) stream.claimed = turn;
      return true;
    }
    return false;
  }

  return {
    get streaming() {
      return stream !== null;
    },

    streamOpened() {
      streams += 1;
      stream = { id: streams, turn: null, claimed: null, echoed: false };
    },

    streamStarted(turn) {
      stream.turn = turn;
      const claimed = stream.claimed;
      stream.claimed = null;
      if (claimed === turn) return null;
      if (claimed !== null) stream.echoed = false;
      if (!stream.echoed && socketTurn?.turn === turn && !socketTurn.own) {
        // Its copy is already running on the socket: skip the rest of it.
        socketTurn.own = true;
        stream.echoed = true;
      } else if (!stream.echoed) {
        echoes.push({ turn, stream: stream.id });
      }
      return claimed === null ? null : giveBack(claimed);
    },

    streamClosed({ started }) {
      const claimed = started ? null : stream?.claimed ?? null;
      stream = null;
      return claimed === null ? null : giveBack(claimed);
    },

    streamLost() {
      if (socketTurn) socketTurn.own = false;
      // A copy that has not started yet is shown whole: the stream will not show the rest.
      if (stream) echoes = echoes.filter((echo) => echo.stream !== stream.id);
    },

    socketEventIsOwn(name, data) {
      if (name === 'turn_start') socketTurn = { turn: data.turn, own: socketTurnStarts(data.turn) };
      // Bound in the middle of a turn (no turn_start seen): it is this tab's if it streams one.
      const own = socketTurn ? socketTurn.own : stream !== null || echoes.length > 0;
      if (name === 'turn_end') {
        if (!socketTurn) echoes = [];
        socketTurn = null;
      }
      return own;
    },
  };
}
