// The user's side of the markup (docs/markup.md): the `<answer>` and `<response>` a reader's
// action sends, escaped exactly as chat/markup/compose.py escapes them on the server.

function escapeText(text) {
  return String(text).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

function escapeAttribute(text) {
  return escapeText(text).replace(/"/g, '&quot;').replace(/'/g, '&#x27;');
}

/**
 * `<answer …>` as chat/markup/compose.py writes it; no index for an answer in own words.
 * `askedIn` is the id of the message that asked the question (a question is known by it).
 */
export function composeAnswer(questionId, optionIndex, message, askedIn) {
  const index = Number.isInteger(optionIndex) ? ` question-option-index="${optionIndex}"` : '';
  const asked = askedIn ? ` asked-in="${escapeAttribute(askedIn)}"` : '';
  return `<answer question="${escapeAttribute(questionId)}"${index}${asked}>${escapeText(message.trim())}</answer>`;
}

/** The `<response type="find_similar">` of a finished search, with its readable sentence. */
export function composeResponse(classId, requestId, count) {
  const sentence =
    `Find Similar located ${count} result${count === 1 ? '' : 's'} belonging to class ${classId}.`;
  return (
    `<response type="find_similar" class-id="${escapeAttribute(classId)}" ` +
    `request="${escapeAttribute(requestId)}">${escapeText(sentence)}</response>`
  );
}
