// The streaming bubble's preview: the answer streamed so far, rendered by the server exactly as
// its stored message will be, except that half-open Markdown (an unclosed fence, a last line
// that is only `-` or `|---`) stays text until it closes (POST /chat/<id>/preview/, see
// docs/protocol.md). The page never renders Markdown itself, so the preview and the final
// message come from one renderer and one sanitiser.
//
// At most one request is in flight and at most one starts per PREVIEW_INTERVAL_MS; the newest
// text always gets a request after the current one; nothing is shown after `close()` (the
// final message replaces the bubble). If the server cannot render (a network error, text over
// its limit) the bubble falls back to plain text for the rest of the stream.

export const PREVIEW_INTERVAL_MS = 120;

/**
 * @param {{
 *   url: string,
 *   headers?: Record<string, string>,
 *   render: (html: string) => void,     shows the server's HTML
 *   fallback: (text: string) => void,   shows the raw text when the server cannot render it
 *   fetch?: typeof fetch,
 *   setTimeout?: typeof setTimeout,
 *   clearTimeout?: typeof clearTimeout,
 *   now?: () => number,
 * }} options
 */
export function createStreamPreview({
  url,
  headers = {},
  render,
  fallback,
  fetch = globalThis.fetch.bind(globalThis),
  setTimeout = globalThis.setTimeout.bind(globalThis),
  clearTimeout = globalThis.clearTimeout.bind(globalThis),
  now = () => Date.now(),
}) {
  let text = '';
  let dirty = false;
  let inFlight = false;
  let closed = false;
  let failed = false;
  let timer = null;
  let lastStart = -Infinity;

  function schedule() {
    if (closed || inFlight || timer !== null || !dirty) return;
    timer = setTimeout(send, Math.max(0, lastStart + PREVIEW_INTERVAL_MS - now()));
  }

  async function send() {
    timer = null;
    if (closed || !dirty) return;
    dirty = false;
    inFlight = true;
    lastStart = now();
    try {
      const response = await fetch(url, {
        method: 'POST',
        headers: { ...headers, 'Content-Type': 'application/json', Accept: 'text/html' },
        credentials: 'same-origin',
        body: JSON.stringify({ text }),
      });
      if (!response.ok) throw new Error(`the server answered ${response.status}`);
      const html = await response.text();
      if (!closed && !failed) render(html);
    } catch {
      failed = true;
      if (!closed) fallback(text);
    } finally {
      inFlight = false;
      if (!failed) schedule();
    }
  }

  return {
    /** The whole text streamed so far. */
    update(next) {
      if (closed) return;
      text = next;
      if (failed) {
        fallback(text);
        return;
      }
      dirty = true;
      schedule();
    },
    /** The stream ended or the bubble went away: drop whatever is still on its way. */
    close() {
      closed = true;
      if (timer !== null) clearTimeout(timer);
      timer = null;
    },
  };
}
