// The chat session the panel shows: created by its first message, and its allow_backend_tools
// toggle (ticked before that, it is sent with the creation).

import { errorText, request } from './http.js';

/**
 * @param {{
 *   panel: HTMLElement,                    the #chat-panel (data-session-id)
 *   notice: (text: string) => void,
 *   onCreated?: (id: string) => Promise<void> | void,  a new session exists (the socket binds it)
 *   document?: Document,
 * }} options
 */
export function createSessionState({ panel, notice, onCreated = () => {}, document = globalThis.document }) {
  const toggle = panel.querySelector('#allow-backend-tools');
  let id = panel.dataset.sessionId || null;

  let creating = null; // the one request creating the session, shared by concurrent callers

  /**
   * The session's id, creating the session first when the panel shows a new conversation (its
   * first message): with "Allow backend tools" as the reader set it before.
   */
  function ensure() {
    if (id) return Promise.resolve(id);
    creating ??= create().finally(() => {
      creating = null;
    });
    return creating;
  }

  async function create() {
    const body = { allow_backend_tools: Boolean(toggle?.checked) };
    const response = await request('/api/sessions', { method: 'POST', body, document });
    if (!response.ok) throw new Error(await errorText(response));
    id = (await response.json()).id;
    panel.dataset.sessionId = id;
    // A panel swapped away meanwhile (the reader opened another conversation) keeps the
    // address of the one on screen.
    if (panel.isConnected) history.replaceState(null, '', `/chat/${id}/`);
    await onCreated(id); // the socket is bound and the tools registered before the first turn
    return id;
  }

  async function setAllowBackendTools(wanted) {
    // A conversation not saved yet keeps the wish in the box until its first message.
    if (!id && !creating) return;
    try {
      await ensure();
      const response = await request(`/api/sessions/${id}`, {
        method: 'PATCH',
        body: { allow_backend_tools: wanted },
        document,
      });
      if (!response.ok) throw new Error(await errorText(response));
      toggle.checked = (await response.json()).allow_backend_tools;
    } catch (error) {
      toggle.checked = !wanted;
      notice(`The setting was not changed: ${error.message}`);
    }
  }

  toggle?.addEventListener('change', () => setAllowBackendTools(toggle.checked));

  return {
    get id() {
      return id;
    },
    ensure,
    /** What a live update said changed beside the transcript: the toggle's state. */
    applyState(response) {
      const allow = response.headers.get('X-GeoSense-Allow-Backend-Tools');
      if (allow !== null && toggle) toggle.checked = allow === 'true';
    },
  };
}
