// The page's side of the wire: the socket frames, turn events and client-tool declarations the
// server defines in geosense/wire.py, as JSDoc types, and the builders of the frames the page
// sends. No other module of the page writes a frame's `type`. tests/test_wire.py checks that
// both sides name the same events, frames and context types.

/** Every context a user message may carry. */
export const CONTEXT_TYPES = Object.freeze(['visibility', 'position', 'image', 'selection']);

/** The contexts the map gives and a question option may ask for (`context="…"`). */
export const MAP_CONTEXT_TYPES = Object.freeze(['visibility', 'position', 'image']);

/** The turn events, the same on the SSE stream and in the socket's `event` frames. */
export const TURN_EVENTS = Object.freeze([
  'turn_start',
  'text_delta',
  'backend_thinking',
  'backend_tool_call',
  'client_tool_call',
  'message',
  'error',
  'turn_end',
]);

/** The frames the page sends. */
export const CLIENT_FRAMES = Object.freeze({
  sessionBind: 'session-bind',
  clientToolRegister: 'client-tool-register',
  clientToolResult: 'client-tool-result',
});

/** The codes the server closes a socket with: log in again; the live channel failed (read the
 * stored transcript, then reconnect). geosense/wire.py CLOSE_*. */
export const CLOSE_CODES = Object.freeze({
  unauthenticated: 4401,
  liveLost: 4503,
});

/** The frames the server sends. */
export const SERVER_FRAMES = Object.freeze({
  sessionBound: 'session-bound',
  clientToolRegistered: 'client-tool-registered',
  clientToolInvoke: 'client-tool-invoke',
  clientToolCancelled: 'client-tool-cancelled',
  event: 'event',
  annotationsChanged: 'annotations-changed',
  error: 'error',
});

/**
 * @typedef {'visibility' | 'position' | 'image' | 'selection'} ContextType
 * @typedef {{type: ContextType, data: any}} DataContext
 *
 * @typedef {{
 *   kind: 'blocking' | 'one-way',
 *   name: string,
 *   description: string,
 *   arguments: object,
 *   result?: object,
 *   serve?: boolean,
 *   title?: string,
 *   summary?: string,
 * }} ClientToolDeclaration
 *
 * @typedef {'turn_start' | 'text_delta' | 'backend_thinking' | 'backend_tool_call'
 *   | 'client_tool_call' | 'message' | 'error' | 'turn_end'} EventName
 * @typedef {{session: string, turn: number}} TurnStartData
 * @typedef {{delta: string}} TextDeltaData
 * @typedef {{text: string}} BackendThinkingData
 * @typedef {{call_id: string, name: string, arguments: object, ok: boolean, error?: string,
 *   title: string, summary: string, problem?: string}} BackendToolCallData
 * @typedef {{call_id: string, name: string, arguments: object, kind: 'blocking' | 'one-way',
 *   title: string, summary: string}} ClientToolCallData
 * @typedef {{id: number, tool: string, arguments: object, reasons: string[],
 *   cost_credits: number, status: string, title: string, summary: string,
 *   decided_at: string | null}} ApprovalData
 * @typedef {{tool_call: string, name: string, arguments: object, status: string,
 *   title: string, summary: string}} DecisionData
 * @typedef {{id: number, role: string, content: string, created: string, turn: number,
 *   pending_approval: ApprovalData | null, pending_decision: DecisionData | null,
 *   approval?: ApprovalData, decision?: DecisionData}} MessageData
 * @typedef {{message: string}} ErrorData
 *
 * Frames, server → page:
 * @typedef {{type: 'session-bound', session: string}} SessionBoundFrame
 * @typedef {{type: 'client-tool-registered', tools: string[]}} ClientToolRegisteredFrame
 * @typedef {{type: 'client-tool-invoke', correlationId: string, name: string, arguments: object}}
 *   ClientToolInvokeFrame
 * @typedef {{type: 'client-tool-cancelled', correlationId: string}} ClientToolCancelledFrame
 * @typedef {{type: 'event', event: EventName, data: object, seq?: number}} EventFrame
 *   (`seq`: the event's number in its turn; a page that read the turn's progress skips
 *   the events it already has)
 * @typedef {{type: 'annotations-changed', revision: string}} AnnotationsChangedFrame
 * @typedef {{type: 'error', status: number, error: string, tool?: string,
 *   correlationId?: string}} ErrorFrame
 *
 * Frames, page → server:
 * @typedef {{type: 'session-bind', session: string}} SessionBindFrame
 * @typedef {{type: 'client-tool-register', tools: ClientToolDeclaration[]}}
 *   ClientToolRegisterFrame
 * @typedef {{type: 'client-tool-result', correlationId: string, result?: object,
 *   error?: string}} ClientToolResultFrame
 */

/** @returns {SessionBindFrame} */
export function sessionBindFrame(session) {
  return { type: CLIENT_FRAMES.sessionBind, session };
}

/**
 * @param {ClientToolDeclaration[]} tools
 * @returns {ClientToolRegisterFrame}
 */
export function clientToolRegisterFrame(tools) {
  return { type: CLIENT_FRAMES.clientToolRegister, tools };
}

/**
 * The page's answer to an invoke: a result object, or a refusal the model reads.
 *
 * @param {string} correlationId
 * @param {{result: object} | {error: string}} answer
 * @returns {ClientToolResultFrame}
 */
export function clientToolResultFrame(correlationId, answer) {
  const frame = { type: CLIENT_FRAMES.clientToolResult, correlationId };
  if ('result' in answer) frame.result = answer.result;
  else frame.error = answer.error;
  return frame;
}

/** Freeze a value and everything in it (declarations are shared, never edited). */
export function deepFreeze(value) {
  if (value && typeof value === 'object') {
    Object.values(value).forEach(deepFreeze);
    Object.freeze(value);
  }
  return value;
}

/**
 * A client-tool declaration as sent in `client-tool-register`, frozen.
 *
 * @param {ClientToolDeclaration} declaration
 * @returns {Readonly<ClientToolDeclaration>}
 */
export function clientToolDeclaration(declaration) {
  return deepFreeze(declaration);
}
