// Hermes web UI: recent sessions, a session's requests as tool-call waterfalls updated live
// from the gateway's server-sent events, a blueprint run's steps as a waterfall of their own,
// the recorded messages as JSON, the session's approvals
// (Approve / Deny for the caller who may decide them), and a form for POST /v1/route.
//
// Everything that comes from the bus or the API is put on the page as text (text nodes,
// textContent, dataset, title): never as HTML.
'use strict';

(() => {
  const $ = (id) => document.getElementById(id);

  // ---- small helpers -------------------------------------------------------------------

  // el builds an element. Strings among children become text nodes. attrs are constants of
  // this file or go through dataset/title, so bus data never lands in markup.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v == null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'data') Object.assign(e.dataset, v);
      else if (k === 'title') e.title = String(v);
      else if (k === 'on') for (const [ev, fn] of Object.entries(v)) e.addEventListener(ev, fn);
      else if (/^on|^style$|^href$|^src$/i.test(k)) throw new Error('el: attribute ' + k + ' is not allowed');
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c == null || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  function clear(node) {
    while (node.firstChild) node.firstChild.remove();
  }

  function pad(n, w) {
    return String(n).padStart(w, '0');
  }

  function clock(t) {
    if (!Number.isFinite(t)) return '';
    const d = new Date(t);
    return pad(d.getHours(), 2) + ':' + pad(d.getMinutes(), 2) + ':' + pad(d.getSeconds(), 2) + '.' + pad(d.getMilliseconds(), 3);
  }

  function fullTime(t) {
    return Number.isFinite(t) ? new Date(t).toLocaleString() + ' (' + clock(t) + ')' : '';
  }

  function ago(t, now) {
    if (!Number.isFinite(t)) return '';
    const s = Math.max(0, Math.round((now - t) / 1000));
    if (s < 5) return 'just now';
    if (s < 60) return s + ' s ago';
    if (s < 3600) return Math.floor(s / 60) + ' min ago';
    if (s < 86400) return Math.floor(s / 3600) + ' h ago';
    return new Date(t).toLocaleDateString();
  }

  function dur(ms) {
    if (!Number.isFinite(ms)) return '';
    ms = Math.max(0, ms);
    if (ms < 1000) return Math.round(ms) + ' ms';
    if (ms < 60000) return (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + ' s';
    const m = Math.floor(ms / 60000);
    return m + ' min ' + Math.round((ms - m * 60000) / 1000) + ' s';
  }

  function plural(n, one, many) {
    return n + ' ' + (n === 1 ? one : many);
  }

  function parseTime(v) {
    const t = typeof v === 'string' ? Date.parse(v) : NaN;
    return Number.isFinite(t) && t > 0 ? t : NaN;
  }

  // msgTime is when a message was made (its sender's clock), else when the stream stored it.
  function msgTime(m) {
    const t = parseTime(m.created_at);
    return Number.isFinite(t) ? t : parseTime(m.time);
  }

  // prettyJSON re-indents JSON text without parsing it, so numbers keep every digit.
  function prettyJSON(text) {
    let out = '';
    let depth = 0;
    let inStr = false;
    const nl = () => '\n' + '  '.repeat(depth);
    for (let i = 0; i < text.length; i++) {
      const ch = text[i];
      if (inStr) {
        out += ch;
        if (ch === '\\') out += text[++i] ?? '';
        else if (ch === '"') inStr = false;
        continue;
      }
      switch (ch) {
        case '"': inStr = true; out += ch; break;
        case '{': case '[': {
          const close = ch === '{' ? '}' : ']';
          let j = i + 1;
          while (j < text.length && /\s/.test(text[j])) j++;
          if (text[j] === close) { out += ch + close; i = j; break; }
          depth++; out += ch + nl(); break;
        }
        case '}': case ']': depth = Math.max(0, depth - 1); out += nl() + ch; break;
        case ',': out += ',' + nl(); break;
        case ':': out += ': '; break;
        case ' ': case '\n': case '\r': case '\t': break;
        default: out += ch;
      }
    }
    return out;
  }

  // jsonView shows JSON text with its tokens coloured, as text nodes only.
  function jsonView(text) {
    const pre = el('pre', { class: 'json' });
    const pretty = prettyJSON(text);
    const re = /("(?:\\.|[^"\\])*")(\s*:)?|\b(true|false|null)\b|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?/g;
    let last = 0;
    for (let m; (m = re.exec(pretty));) {
      if (m.index > last) pre.append(pretty.slice(last, m.index));
      let cls = 'j-num';
      if (m[1]) cls = m[2] ? 'j-key' : 'j-str';
      else if (m[3]) cls = m[3] === 'null' ? 'j-null' : 'j-bool';
      pre.append(el('span', { class: cls }, m[1] || m[0]));
      if (m[2]) pre.append(m[2]);
      last = re.lastIndex;
    }
    if (last < pretty.length) pre.append(pretty.slice(last));
    return pre;
  }

  async function errorText(resp) {
    let text = '';
    try { text = await resp.text(); } catch (_) { /* body unreadable */ }
    try {
      const j = JSON.parse(text);
      if (j && j.error) return { code: j.error.code || '', message: j.error.message || '', field: j.error.field || '', body: text };
    } catch (_) { /* not JSON */ }
    return { code: '', message: text.trim() || resp.statusText, field: '', body: text };
  }

  // ---- sessions list -------------------------------------------------------------------

  const sessionsRefreshMS = 3000;
  let sessionsTimer = null;
  let lastSessions = [];

  async function loadSessions() {
    clearTimeout(sessionsTimer);
    try {
      const resp = await fetch('/v1/sessions?limit=50', { headers: { Accept: 'application/json' }, cache: 'no-store' });
      if (resp.status === 401) {
        showSignin('Your sign-in has ended; sign in again.');
        return;
      } else if (!resp.ok) {
        const e = await errorText(resp);
        showSessionsError('Could not load sessions: HTTP ' + resp.status + (e.code ? ' ' + e.code : '') + (e.message ? ' — ' + e.message : ''));
      } else {
        const body = await resp.json();
        lastSessions = Array.isArray(body.sessions) ? body.sessions : [];
        showSessionsError('');
        $('sessions-updated').textContent = 'updated ' + clock(Date.now()).slice(0, 8);
      }
    } catch (err) {
      showSessionsError('Could not reach the gateway: ' + err.message);
    }
    renderSessions();
    sessionsTimer = setTimeout(loadSessions, sessionsRefreshMS);
  }

  function showSessionsError(text) {
    const box = $('sessions-error');
    box.hidden = !text;
    box.textContent = text ? '✗ ' + text : '';
  }

  function renderSessions() {
    const list = $('sessions');
    const now = Date.now();
    clear(list);
    for (const s of lastSessions) {
      const id = String(s.session_id ?? '');
      const last = parseTime(s.last_at);
      const item = el('li', null,
        el('button', {
          type: 'button', class: 'session-item' + (current && current.id === id ? ' selected' : ''),
          data: { session: id }, title: 'last message ' + fullTime(last) + ', stream seq ' + (s.last_seq ?? ''),
          on: { click: () => go(id) },
        },
        el('span', { class: 'session-name' }, id),
        el('span', { class: 'session-meta' },
          plural(Number(s.requests) || 0, 'request', 'requests'), ' · ', ago(last, now)),
        s.last_request_id ? el('span', { class: 'session-meta mono' }, 'last ', String(s.last_request_id)) : null));
      list.append(item);
    }
    $('sessions-empty').hidden = lastSessions.length > 0 || !$('sessions-error').hidden;
  }

  // ---- session state -------------------------------------------------------------------

  // current is the open session: its event stream and everything it has delivered.
  let current = null;

  function go(id) {
    location.hash = id ? 'session=' + encodeURIComponent(id) : '';
  }

  function sessionFromHash() {
    const m = /^#session=(.+)$/.exec(location.hash);
    if (!m) return '';
    try { return decodeURIComponent(m[1]); } catch (_) { return ''; }
  }

  function onHash() {
    const id = sessionFromHash();
    if (id) openSession(id);
    else closeSession();
    renderSessions();
  }

  function closeSession() {
    if (current) {
      current.closed = true;
      if (current.es) current.es.close();
      clearTimeout(current.retryTimer);
      clearTimeout(current.flushTimer);
      clearTimeout(current.approvalsTimer);
    }
    current = null;
    $('session').hidden = true;
    $('empty').hidden = false;
    hideDetail();
  }

  function openSession(id) {
    if (current && current.id === id) return;
    const form = $('f-session');
    if (!form.value || (current && form.value === current.id)) form.value = id; // the form follows the view
    closeSession();
    current = {
      id,
      es: null,
      closed: false,
      lastSeq: 0,
      seen: new Set(),
      raw: new Map(), // seq → the event's JSON text, as sent
      msgs: [],
      requests: new Map(), // request_id → state, first seen first
      runs: new Map(), // blueprint run_id → its steps' events, first seen first
      runBlocks: new Map(), // run_id → rendered element
      runsDirty: false,
      blocks: new Map(), // request_id → rendered element
      dirty: new Set(),
      fresh: false,
      flushTimer: null,
      retryTimer: null,
      retryDelay: 1000,
      unreadable: 0,
      approvals: new Map(), // approval id → the API's view of it, as last read
      approvalNotes: new Map(), // approval id → what the last decision made here answered
      reasons: new Map(), // approval id → the reason typed to deny it, kept across redraws
      approvalsTimer: null,
    };
    $('empty').hidden = true;
    $('session').hidden = false;
    $('session-id').textContent = id;
    $('session-error').hidden = true;
    clear($('requests'));
    clear($('runs-list'));
    $('runs').hidden = true;
    clear($('log-list'));
    clear($('approvals-list'));
    $('approvals').hidden = true;
    $('log-count').textContent = '0';
    hideDetail();
    updateSummary();
    connect(current);
    loadApprovals(current);
  }

  function eventsURL(s) {
    let url = '/v1/sessions/' + encodeURIComponent(s.id) + '/events';
    if (s.lastSeq > 0) url += '?after=' + s.lastSeq;
    return url;
  }

  function connect(s) {
    if (s.closed) return;
    setConn('connecting', s.lastSeq > 0 ? 'reconnecting…' : 'connecting…');
    const url = eventsURL(s);
    const es = new EventSource(url);
    s.es = es;
    es.onopen = () => {
      if (s.closed) return;
      s.retryDelay = 1000;
      $('session-error').hidden = true;
      setConn('live', '● live');
    };
    es.onmessage = (ev) => {
      if (!s.closed) receive(s, ev);
    };
    es.onerror = () => {
      if (s.closed) return;
      if (es.readyState === EventSource.CONNECTING) {
        // The browser reconnects by itself and sends Last-Event-ID.
        setConn('reconnecting', 'reconnecting… (showing what arrived so far)');
        return;
      }
      // The browser gave up (an answer other than a 200 event stream): ask why, then
      // reconnect from the last message seen.
      es.close();
      s.es = null;
      diagnose(s, url);
    };
  }

  async function diagnose(s, url) {
    let why = 'the event stream closed';
    let retry = true;
    try {
      const ctl = new AbortController();
      const resp = await fetch(url, { signal: ctl.signal, cache: 'no-store' });
      if (resp.ok) {
        ctl.abort();
      } else {
        if (resp.status === 401) {
          showSignin('Your sign-in has ended; sign in again.');
          return;
        }
        const e = await errorText(resp);
        why = 'HTTP ' + resp.status + (e.code ? ' ' + e.code : '') + (e.message ? ' — ' + e.message : '');
        if (resp.status === 404) why = 'no session ' + s.id + ' of yours is known (yet): it starts with its first request';
        // A request the gateway refuses as such will not get better by asking again.
        retry = resp.status >= 500 || resp.status === 404 || resp.status === 429 || resp.status === 408;
      }
    } catch (err) {
      why = 'the gateway is not reachable (' + err.message + ')';
    }
    if (s.closed) return;
    const box = $('session-error');
    box.hidden = false;
    if (!retry) {
      box.textContent = '✗ Cannot follow this session: ' + why;
      setConn('offline', '✗ stopped');
      return;
    }
    const wait = s.retryDelay;
    s.retryDelay = Math.min(s.retryDelay * 2, 15000);
    box.textContent = '✗ Live updates interrupted: ' + why + '. Retrying in ' + Math.round(wait / 1000) + ' s; nothing is lost, the view catches up from message ' + s.lastSeq + '.';
    setConn('offline', '✗ disconnected');
    s.retryTimer = setTimeout(() => connect(s), wait);
  }

  function setConn(state, text) {
    const c = $('conn');
    c.dataset.state = state;
    c.textContent = text;
  }

  function receive(s, ev) {
    let m;
    try {
      m = JSON.parse(ev.data);
    } catch (err) {
      m = { seq: Number(ev.lastEventId) || 0, error: 'the event is not JSON: ' + err.message };
    }
    if (!m || typeof m !== 'object') m = { seq: Number(ev.lastEventId) || 0, error: 'the event is not a JSON object' };
    const seq = Number(m.seq ?? ev.lastEventId) || 0;
    if (seq > 0) {
      if (s.seen.has(seq)) return; // replayed after a reconnect
      s.seen.add(seq);
      s.lastSeq = Math.max(s.lastSeq, seq);
    }
    s.raw.set(m, ev.data);
    ingest(s, m);
    s.fresh = true;
    schedule(s);
  }

  // callerName names who made a request, as the gateway recorded it.
  function callerName(c) {
    let s = String(c.name || c.id || '?');
    if (c.role) s += ' (' + String(c.role) + ')';
    if (c.user) s += ' for ' + String(c.user);
    return s;
  }

  function requestOf(s, id) {
    let r = s.requests.get(id);
    if (!r) {
      r = { id, request: null, extraRequests: [], calls: new Map(), responses: [], other: [], msgs: [] };
      s.requests.set(id, r);
    }
    return r;
  }

  function callOf(r, id, name) {
    let c = r.calls.get(id);
    if (!c) {
      c = { id, name: name || '', dispatches: [], starts: [], results: [], policies: [], coords: [] };
      r.calls.set(id, c);
    }
    if (!c.name && name) c.name = name;
    return c;
  }

  function ingest(s, m) {
    s.msgs.push(m);
    appendLog(s, m);
    const p = m.payload && typeof m.payload === 'object' ? m.payload : null;
    if (m.type === 'blueprint_step.v1' && p && !m.error) {
      ingestStep(s, m);
      return;
    }
    const rid = String(m.request_id || (p && p.request_id) || '');
    const r = requestOf(s, rid);
    r.msgs.push(m);
    s.dirty.add(rid);
    if (m.error || !p) {
      r.other.push(m);
      return;
    }
    switch (m.type) {
      case 'request.v1':
        if (!r.request) r.request = m;
        else r.extraRequests.push(m);
        for (const tc of Array.isArray(p.tool_calls) ? p.tool_calls : []) callOf(r, String(tc.tool_call_id ?? ''), tc.name);
        break;
      case 'tool_call.v1': {
        const call = p.call || {};
        callOf(r, String(call.tool_call_id ?? ''), call.name).dispatches.push(m);
        break;
      }
      case 'tool_started.v1':
        callOf(r, String(p.tool_call_id ?? ''), p.name).starts.push(m);
        break;
      case 'tool_result.v1':
        callOf(r, String(p.tool_call_id ?? ''), p.name).results.push(m);
        if (approvalOf(p)) scheduleApprovals(s);
        break;
      case 'coordination.v1':
        callOf(r, String(p.tool_call_id ?? ''), p.tool).coords.push(m);
        break;
      case 'policy_decision.v1':
        callOf(r, String(p.tool_call_id ?? ''), p.tool).policies.push(m);
        scheduleApprovals(s); // parked, approved, denied or expired: read where it stands
        break;
      case 'response.v1':
        r.responses.push(m);
        for (const res of Array.isArray(p.results) ? p.results : []) callOf(r, String(res.tool_call_id ?? ''), res.name);
        break;
      default:
        r.other.push(m);
    }
  }

  function runOf(s, id) {
    let run = s.runs.get(id);
    if (!run) {
      run = { id, blueprint: '', version: 0, steps: new Map(), end: null, msgs: [] };
      s.runs.set(id, run);
    }
    return run;
  }

  // ingestStep files a blueprint_step event under its run: a step's under the step (steps in
  // the order they first changed), the run's own (no step) as its end.
  function ingestStep(s, m) {
    const p = m.payload;
    const run = runOf(s, String(p.run_id ?? ''));
    if (!run.blueprint && p.blueprint) run.blueprint = String(p.blueprint);
    if (!run.version && p.version) run.version = Number(p.version) || 0;
    run.msgs.push(m);
    if (p.step === undefined || p.step === null || p.step === '') {
      run.end = m;
    } else {
      const id = String(p.step);
      let st = run.steps.get(id);
      if (!st) {
        st = { id, tool: '', events: [] };
        run.steps.set(id, st);
      }
      if (!st.tool && p.tool) st.tool = String(p.tool);
      st.events.push(m);
    }
    s.runsDirty = true;
    if (p.status === 'waiting_approval') scheduleApprovals(s);
  }

  function schedule(s) {
    if (s.flushTimer) return;
    s.flushTimer = setTimeout(() => {
      s.flushTimer = null;
      flush(s);
    }, 30);
  }

  function flush(s) {
    if (s.closed) return;
    const container = $('requests');
    const focused = document.activeElement;
    const focusCall = focused && focused.dataset ? focused.dataset.call : undefined;
    for (const id of s.dirty) {
      const r = s.requests.get(id);
      const block = renderRequest(r, Date.now());
      const old = s.blocks.get(id);
      if (old) {
        const hadFocus = old.contains(focused);
        old.replaceWith(block);
        if (hadFocus && focused.classList.contains('apr-reason')) refocusReason(block, focused);
        else if (hadFocus && focusCall !== undefined) {
          const row = [...block.querySelectorAll('.wf-row.call')].find((e) => e.dataset.call === focusCall);
          if (row) row.focus();
        }
      } else {
        container.prepend(block); // newest first
      }
      s.blocks.set(id, block);
    }
    s.dirty.clear();
    if (s.runsDirty) flushRuns(s, focused);
    updateSummary();
    if (s.fresh) refreshDetail(); // only for new messages, not the clock: keeps the pane's scroll
    s.fresh = false;
  }

  function updateSummary() {
    const s = current;
    if (!s) return;
    const n = [...s.requests.keys()].filter((k) => k !== '').length;
    const last = s.msgs.length ? msgTime(s.msgs[s.msgs.length - 1]) : NaN;
    let text = plural(n, 'request', 'requests') + ' · ' + plural(s.msgs.length, 'message', 'messages');
    if (s.runs.size) text = plural(s.runs.size, 'blueprint run', 'blueprint runs') + ' · ' + text;
    if (Number.isFinite(last)) text += ' · last at ' + clock(last);
    if (s.unreadable) text += ' · ' + plural(s.unreadable, 'unreadable message', 'unreadable messages');
    $('session-summary').textContent = text;
    $('session-empty').hidden = s.msgs.length > 0;
    $('log-count').textContent = String(s.msgs.length);
  }

  // ---- one request: header and waterfall -----------------------------------------------

  function lastOf(a) {
    return a.length ? a[a.length - 1] : null;
  }

  // callView derives what to draw for one call.
  function callView(r, c, t0, now) {
    const resultMsg = lastOf(c.results);
    let result = resultMsg ? resultMsg.payload : null;
    const resp = lastOf(r.responses);
    if (!result && resp && Array.isArray(resp.payload.results)) {
      result = resp.payload.results.find((x) => String(x.tool_call_id) === c.id) || null;
    }
    const dispatchT = c.dispatches.length ? msgTime(c.dispatches[0]) : NaN;
    const ticks = c.starts.map((m) => {
      const t = parseTime(m.payload.started_at);
      return { t: Number.isFinite(t) ? t : msgTime(m), attempt: Number(m.payload.attempt) || Number(m.attempt) || 0, msg: m };
    }).sort((a, b) => a.t - b.t);
    let start = dispatchT;
    if (!Number.isFinite(start)) start = ticks.length ? ticks[0].t : t0;
    let status = 'queued';
    if (result) status = result.status === 'ok' ? 'ok' : 'error';
    else if (resp) status = 'error'; // answered without this call's result
    else if (ticks.length) status = 'running';
    else if (c.dispatches.length) status = 'dispatched';
    let end = now;
    if (result || resp) {
      end = resultMsg ? msgTime(resultMsg) : msgTime(resp);
      for (const tk of ticks) end = Math.max(end, tk.t);
    }
    if (!Number.isFinite(end)) end = start;
    const attempts = result ? Number(result.attempts) || 0 : ticks.reduce((a, tk) => Math.max(a, tk.attempt), 0);
    // What the tool's policy decided last: a refusal on the result, an event (a wait, an
    // approval), or the decision the call was dispatched under.
    let policy = result && result.policy ? result.policy : null;
    if (!policy && c.policies.length) policy = lastOf(c.policies).payload.decision || null;
    if (!policy && c.dispatches.length) policy = lastOf(c.dispatches).payload.policy || null;
    return { status, start, end, ticks, result, attempts, pending: !result && !resp, policy };
  }

  // policyWords is what a tool's policy decided, as the record's Formatter writes it:
  // "denied: allowed_roles (policy v2)".
  function policyWords(d) {
    if (!d) return '';
    let s = String(d.decision || '?');
    if (d.rule) s += ': ' + d.rule;
    if (d.source) s += ' (' + d.source + ' v' + (d.version ?? '?') + ')';
    return s;
  }

  // policyLine is a policy event in words: the decision, why, when to try again, the approval.
  function policyLine(p) {
    const d = p.decision || {};
    let s = (p.tool || '') + ' ' + (p.tool_call_id || '') + ' ' + policyWords(d);
    if (d.reason) s += ' — ' + d.reason;
    const retry = parseTime(d.retry_at);
    if (d.retry_at && Number.isFinite(retry)) s += ' · retry at ' + clock(retry);
    if (d.approval_id) s += ' · approval ' + d.approval_id;
    if (d.by) s += ' · by ' + d.by;
    return s;
  }

  // coordLine is a coordination event in words, as the record's Formatter writes it: what
  // happened to a call's turn on the resource it changes.
  function coordLine(p) {
    let s = (p.tool || '') + ' ' + (p.tool_call_id || '') + ' ' + (p.op || '?') + ' ' + (p.resource || '') + ' ' + (p.tx || '');
    if (p.fence) s += ' fence=' + p.fence;
    if (p.op === 'waiting') s += ' #' + (p.position ?? '?') + (p.held_by ? ' behind ' + p.held_by : '');
    if (p.op === 'conflict' && Array.isArray(p.suggested_order)) s += ' · suggested order: ' + p.suggested_order.join(' → ');
    if (p.reason && p.op !== 'conflict') s += ' (' + p.reason + ')';
    return s;
  }

  const statusWords = {
    ok: '✓ ok', error: '✗ failed', running: '▶ running', dispatched: '→ dispatched', queued: '… waiting',
  };

  const responseWords = {
    answered: '✓ answered', model_failed: '✗ model failed', to_client: '↩ to the client', refused: '✗ not dispatched',
    success: '✓ success', partial_success: '⚠ partial success', failed: '✗ failed', pending: '… running',
  };

  // decisionLines is a model's decision as seed 001 §5.2's log has it (the record's
  // Formatter writes the same for hermes tail and replay).
  function decisionLines(p) {
    const lines = [];
    const cut = (v, n) => { const t = String(v ?? ''); return t.length > n ? t.slice(0, n - 1) + '…' : t; };
    const who = ' (' + cut(p.model, 64) + ' at ' + cut(p.backend, 64) + (p.fell_back ? ', fallback' : '') + ', ' + (p.latency_ms ?? 0) + ' ms)';
    if (p.input) lines.push(['路由', '原始输入: ' + cut(p.input, 200), '']);
    if (p.prefiltered) {
      const cands = (Array.isArray(p.candidates) ? p.candidates : []).map((c) => cut(c.name, 64) + ' ' + Number(c.score || 0).toFixed(2) + (c.similarity ? ' (' + Number(c.similarity).toFixed(2) + ')' : ''));
      lines.push(['路由', '粗筛候选: [' + cut(cands.join(', '), 300) + ']' + (cands.length ? '' : ' (无匹配的工具，已告知模型)'), '']);
    }
    if (p.error) lines.push(['错误', 'LLM: ' + cut(p.error, 300) + who, 'bad']);
    else if (Array.isArray(p.chosen) && p.chosen.length) {
      lines.push(['路由', 'LLM选择: ' + p.chosen.map((c) => cut(c.name, 64) + ' ' + cut(c.arguments, 160) + (c.client ? ' (the client\'s)' : '')).join('; ') + who, '']);
    } else lines.push(['最终', '回复用户: ' + cut(p.answer, 400) + who, '']);
    for (const w of Array.isArray(p.warnings) ? p.warnings : []) {
      const where = cut(w.tool, 64) + (w.call_id ? ' ' + cut(w.call_id, 64) : '');
      const text = w.kind === 'missing_argument' ? '参数key缺失: ' + cut(w.field, 64) + ' (' + where + ')'
        : w.kind === 'unknown_tool' ? '未知工具: ' + where
          : w.kind === 'not_json' ? '参数不是JSON对象: ' + where
            : w.kind === 'bad_arguments' ? '参数不符合契约: ' + where + ': ' + cut(w.message, 300)
              : w.kind === 'embeddings' ? '仅用词法粗筛: ' + cut(w.message, 300) : cut(w.message, 300);
      lines.push(['警告', text, 'warn']);
    }
    return lines;
  }

  // summaryLine is a session's summary as the record's Formatter writes it.
  function summaryLine(p) {
    const cut = (v, n) => { const t = String(v ?? ''); return t.length > n ? t.slice(0, n - 1) + '…' : t; };
    const total = Number(p.messages) || 0, fresh = Number(p.new) || 0;
    return '会话摘要 (消息 ' + (total - fresh + 1) + '–' + total + ', ' + fresh + ' 条新消息): ' + cut(p.text, 400) +
      ' (' + cut(p.model, 64) + ' at ' + cut(p.backend, 64) + ')';
  }

  function renderRequest(r, now) {
    const req = r.request;
    const resp = lastOf(r.responses);
    const decisions = r.other.filter((m) => m.type === 'llm_decision.v1' && m.payload);
    // A turn with a decision and no request: the model answered, failed, or made only calls
    // that were refused or are the client's to run.
    const turnOnly = !req && !resp && decisions.length > 0;
    let respStatus = resp ? String(resp.payload.status || 'failed') : 'pending';
    if (turnOnly) {
      const d = lastOf(decisions).payload;
      const chosen = Array.isArray(d.chosen) ? d.chosen : [];
      respStatus = d.error ? 'model_failed' : !chosen.length ? 'answered' : chosen.every((c) => c.client) ? 'to_client' : 'refused';
    }
    let t0 = req ? msgTime(req) : NaN;
    if (!Number.isFinite(t0)) t0 = Math.min(...r.msgs.map(msgTime).filter(Number.isFinite), now);

    const calls = [...r.calls.values()].map((c) => ({ c, v: callView(r, c, t0, now) }));
    let t1 = resp ? msgTime(resp) : now;
    for (const { v } of calls) t1 = Math.max(t1, v.end);
    if (!Number.isFinite(t1)) t1 = t0;
    const span = Math.max(t1 - t0, 10); // at least 10 ms, so the axis reads in whole ms
    const x = (t) => Math.min(100, Math.max(0, ((t - t0) / span) * 100));

    const block = el('article', { class: 'req', data: { request: r.id, status: respStatus } });

    // Header: status, ids, intent, time; click shows the request and response messages.
    const intent = req && req.payload ? String(req.payload.intent ?? '') : '';
    const head = el('button', {
      type: 'button', class: 'req-head',
      title: 'Show the request and response messages',
      on: { click: () => showDetail({ kind: 'request', request: r.id }) },
    },
    el('span', { class: 'badge st-' + respStatus }, responseWords[respStatus] || respStatus),
    el('span', { class: 'req-id mono' }, r.id || '(messages without a request id)'),
    intent ? el('span', { class: 'intent' }, intent) : null,
    el('span', { class: 'req-meta' },
      Number.isFinite(t0) ? clock(t0) : '',
      ' · ', plural(calls.length, 'call', 'calls'),
      ' · ', resp ? 'answered in ' + dur(msgTime(resp) - t0) : turnOnly ? 'a model turn' : 'running for ' + dur(now - t0),
      req && req.payload && req.payload.serial ? ' · serial' : '',
      req && req.caller ? ' · by ' + callerName(req.caller) : ''));
    block.append(head);

    for (const d of decisions) {
      const box = el('div', { class: 'decision mono' });
      for (const [tag, text, cls] of decisionLines(d.payload)) box.append(el('div', { class: cls }, '[' + tag + '] ', text));
      block.append(box);
    }
    for (const m of r.other.filter((o) => o.type === 'llm_summary.v1' && o.payload)) {
      block.append(el('div', { class: 'decision summary mono' }, '[摘要] ', summaryLine(m.payload)));
    }
    const cancel = r.other.find((m) => m.type === 'cancel.v1' && m.payload);
    if (resp && resp.payload.error && resp.payload.error.code === 'CANCELLED') {
      block.append(el('p', { class: 'error-box' }, '⊘ Cancelled: ', String(resp.payload.error.message ?? '')));
    } else if (resp && resp.payload.error) {
      block.append(el('p', { class: 'error-box' },
        '✗ The request failed as a whole: ', el('b', { class: 'mono' }, String(resp.payload.error.code ?? '')),
        ' — ', String(resp.payload.error.message ?? '')));
    } else if (cancel) {
      block.append(el('p', { class: 'error-box' }, '⊘ Cancelled by ', String(cancel.payload.by ?? '?'),
        cancel.payload.reason ? ' — ' + String(cancel.payload.reason) : ''));
    }
    const unreadable = r.other.filter((m) => m.error);
    if (unreadable.length) {
      block.append(el('p', { class: 'error-box' },
        '✗ ' + plural(unreadable.length, 'message', 'messages') + ' of this request could not be read: ',
        String(unreadable[0].error)));
    }
    if (r.extraRequests.length) {
      block.append(el('p', { class: 'note' }, 'This request was recorded ' + (r.extraRequests.length + 1) + ' times (a resend; it ran once).'));
    }

    if (calls.length) {
      const wf = el('div', { class: 'wf', role: 'list' });
      const step = niceStep(span);
      const grid = [];
      for (let t = 0; t <= span + 1e-9; t += step) grid.push(t);
      wf.append(axisRow(span, grid));
      for (const { c, v } of calls) {
        wf.append(callRow(r, c, v, x, grid.map((t) => (t / span) * 100)));
        for (const m of c.policies) {
          wf.append(el('div', { class: 'wf-policy mono', data: { call: c.id, decision: String((m.payload.decision || {}).decision || '') } },
            '[policy] ', clock(msgTime(m)), ' ', policyLine(m.payload)));
        }
        for (const m of c.coords) {
          wf.append(el('div', { class: 'wf-policy mono', data: { call: c.id, coord: String(m.payload.op || '') } },
            '[coord] ', clock(msgTime(m)), ' ', coordLine(m.payload)));
        }
        const turn = lastOf(c.coords);
        if (turn && turn.payload.op === 'waiting' && v.pending && !c.dispatches.length) {
          // Not dispatched yet: it waits for its turn on the resource it changes.
          wf.append(el('div', { class: 'wf-wait', data: { call: c.id, waitsFor: String(turn.payload.resource || '') } },
            '⏳ waits for its turn on ', el('b', { class: 'mono' }, String(turn.payload.resource || '')),
            ' (#' + (turn.payload.position ?? '?') + (turn.payload.held_by ? ', behind ' + turn.payload.held_by : '') + ')'));
        }
        if (v.status === 'error' && v.result) wf.append(errorRow(c, v));
        const apr = approvalOf(v.result);
        if (apr) wf.append(approvalBox(current, apr, el('span', { class: 'apr-what' }, 'This call waits for a person\'s approval:')));
        else if (v.status === 'error' && !v.result) {
          wf.append(el('div', { class: 'wf-err' }, el('span', { class: 'err-code' }, 'NO RESULT'),
            ' the response came without a result for this call'));
        }
      }
      block.append(wf);
    } else if (req) {
      block.append(el('p', { class: 'muted small' }, 'No tool calls.'));
    }
    return block;
  }

  function niceStep(span) {
    const raw = span / 5;
    const pow = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (m * pow >= raw) return m * pow;
    return 10 * pow;
  }

  function axisRow(span, grid, what = 'tool call', info = 'time · tries') {
    const track = el('div', { class: 'wf-track axis', 'aria-hidden': 'true' });
    for (const [i, t] of grid.entries()) {
      const g = el('span', { class: 'grid' + (i % 2 ? ' odd' : '') }, dur(t));
      g.style.left = (t / span) * 100 + '%';
      if ((t / span) > 0.92) g.classList.add('end');
      track.append(g);
    }
    return el('div', { class: 'wf-row wf-axis' },
      el('div', { class: 'wf-label muted small' }, what),
      track,
      el('div', { class: 'wf-info muted small' }, info));
  }

  function callRow(r, c, v, x, gridPct) {
    const track = el('div', { class: 'wf-track' });
    for (const pct of gridPct) {
      const g = el('span', { class: 'gl' });
      g.style.left = pct + '%';
      track.append(g);
    }
    // Waiting for a worker (dispatch to the first try) is drawn light, running solid.
    const ran = v.ticks.length ? Math.min(Math.max(v.ticks[0].t, v.start), v.end) : v.start;
    if (ran > v.start) {
      const wait = el('div', { class: 'bar wait st-' + v.status, title: 'waited ' + dur(ran - v.start) + ' for a worker' });
      wait.style.left = x(v.start) + '%';
      wait.style.width = (x(ran) - x(v.start)) + '%';
      track.append(wait);
    }
    const bar = el('div', { class: 'bar st-' + v.status + (v.status === 'error' && !v.attempts ? ' untried' : '') });
    bar.style.left = x(ran) + '%';
    bar.style.width = Math.max(0, x(v.end) - x(ran)) + '%';
    track.append(bar);
    for (const tk of v.ticks) {
      const tick = el('span', {
        class: 'tick' + (tk.attempt > 1 ? ' retry' : ''),
        title: 'try ' + tk.attempt + ' started at ' + clock(tk.t),
      }, String(tk.attempt || '?'));
      tick.style.left = x(tk.t) + '%';
      track.append(tick);
    }
    const res = v.result;
    const retries = Math.max(0, v.attempts - 1);
    const info = el('div', { class: 'wf-info' },
      el('span', { class: 'dur' }, v.pending ? dur(v.end - v.start) + '…' : dur(v.end - v.start)),
      el('span', { class: 'tries' + (retries ? ' has-retries' : '') },
        v.attempts ? plural(v.attempts, 'try', 'tries') + (retries ? ' (' + plural(retries, 'retry', 'retries') + ')' : '') : (res ? 'not tried' : '')));
    const label = el('div', { class: 'wf-label' },
      el('span', { class: 'line' },
        el('span', { class: 'st st-' + v.status }, statusWords[v.status]),
        el('span', { class: 'tool-name' }, c.name || '?'),
        res && res.contract_version ? el('span', { class: 'contract', title: 'checked against version ' + res.contract_version + ' of the tool\'s contract' }, 'contract v' + res.contract_version) : null,
        v.policy ? el('span', { class: 'policy pol-' + String(v.policy.decision || ''), data: { decision: String(v.policy.decision || '') },
          title: 'what the tool\'s policy decided' + (v.policy.reason ? ': ' + v.policy.reason : '') }, 'policy: ' + policyWords(v.policy)) : null),
      el('span', { class: 'call-id mono' }, c.id));
    const tipParts = [c.name + ' ' + c.id, statusWords[v.status]];
    if (res && res.route) tipParts.push('route ' + res.route);
    if (res && res.contract_version) tipParts.push('contract v' + res.contract_version);
    if (v.policy) tipParts.push('policy: ' + policyWords(v.policy));
    if (res && Number.isFinite(Number(res.execution_time_ms))) tipParts.push('tool time ' + res.execution_time_ms + ' ms');
    return el('div', {
      class: 'wf-row call st-' + v.status, role: 'listitem', tabindex: '0',
      data: { call: c.id, status: v.status, attempts: String(v.attempts) },
      title: tipParts.join(' · ') + ' — click for the messages',
      on: {
        click: () => showDetail({ kind: 'call', request: r.id, call: c.id }),
        keydown: (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); showDetail({ kind: 'call', request: r.id, call: c.id }); } },
      },
    }, label, track, info);
  }

  function errorRow(c, v) {
    const res = v.result;
    let content = '';
    if (res.content !== undefined && res.content !== null) {
      content = typeof res.content === 'string' ? res.content : JSON.stringify(res.content);
      if (content.length > 300) content = content.slice(0, 300) + '…';
    }
    return el('div', { class: 'wf-err', data: { call: c.id } },
      el('span', { class: 'err-code' }, String(res.error_code || 'ERROR')),
      res.error_origin ? el('span', { class: 'err-origin' }, '(' + res.error_origin + (res.tool_error_code ? ': ' + res.tool_error_code : '') + ')') : null,
      content ? el('span', { class: 'err-content mono' }, content) : null,
      res.recovery_hint ? el('span', { class: 'hint' }, el('b', null, 'Hint: '), String(res.recovery_hint)) : null);
  }

  // ---- a blueprint run: its steps as a waterfall ---------------------------------------

  // flushRuns redraws the session's blueprint runs, above its requests.
  function flushRuns(s, focused) {
    s.runsDirty = false;
    const box = $('runs-list');
    const now = Date.now();
    for (const run of s.runs.values()) {
      const block = renderRun(s, run, now);
      const old = s.runBlocks.get(run.id);
      if (old) {
        const hadFocus = old.contains(focused);
        old.replaceWith(block);
        if (hadFocus && focused.classList.contains('apr-reason')) refocusReason(block, focused);
        else if (hadFocus && focused.dataset && focused.dataset.step !== undefined) {
          const row = [...block.querySelectorAll('.wf-row.bp-step')].find((e) => e.dataset.step === focused.dataset.step);
          if (row) row.focus();
        }
      } else {
        box.append(block);
      }
      s.runBlocks.set(run.id, block);
    }
    $('runs').hidden = !s.runs.size;
  }

  // stepAt is when a step's event happened: the run's time on it, else the message's.
  function stepAt(m) {
    const t = parseTime(m.payload.at);
    return Number.isFinite(t) ? t : msgTime(m);
  }

  // stepView derives what to draw for one step: its status (its last event's), a bar from its
  // first running event to its end, the condition it was decided by, the approval it waits for.
  function stepView(st, now) {
    const last = lastOf(st.events).payload;
    const status = String(last.status || '?');
    const running = st.events.find((m) => m.payload.status === 'running');
    const ended = st.events.findLast((m) => m.payload.status === 'succeeded' || m.payload.status === 'failed');
    let start = running ? stepAt(running) : NaN;
    let end = ended ? stepAt(ended) : NaN;
    const ms = ended ? Number(ended.payload.duration_ms) : NaN;
    if (!Number.isFinite(start) && Number.isFinite(end)) start = Number.isFinite(ms) && ms > 0 ? end - ms : end;
    const pending = !ended && (status === 'running' || status === 'waiting_approval');
    if (pending) end = now;
    if (!Number.isFinite(end)) end = start;
    const withCond = st.events.findLast((m) => m.payload.condition && typeof m.payload.condition === 'object');
    const withApproval = st.events.findLast((m) => m.payload.approval_id);
    const failed = ended && ended.payload.status === 'failed' ? ended.payload : null;
    return {
      status, start, end, pending, ms: Number.isFinite(ms) && ms > 0 ? ms : end - start,
      condition: withCond ? withCond.payload.condition : null,
      approval: withApproval ? String(withApproval.payload.approval_id) : '',
      requestID: String((running || lastOf(st.events)).payload.request_id || ''),
      error: failed ? { code: String(failed.error_code || ''), message: String(failed.error || '') } : null,
    };
  }

  const stepWords = {
    running: '▶ running', succeeded: '✓ succeeded', failed: '✗ failed', skipped: '⤼ skipped', waiting_approval: '… waiting for approval',
  };

  const runWords = {
    running: '… running', succeeded: '✓ succeeded', failed: '✗ failed', transferred: '↪ transferred',
  };

  // stepBar is the bar class of a step's status.
  const stepBar = { succeeded: 'st-ok', failed: 'st-error', running: 'st-running', waiting_approval: 'st-waiting' };

  function cutText(v, n) {
    const t = String(v ?? '');
    return t.length > n ? t.slice(0, n - 1) + '…' : t;
  }

  // conditionWords is a step's condition as evaluated, with the values its paths read:
  // "$.order.status == 'paid' = false ($.order.status = "shipped")".
  function conditionWords(c) {
    let s = cutText(c.expr, 300) + ' = ' + (c.result ? 'true' : 'false');
    const values = c.values && typeof c.values === 'object' && !Array.isArray(c.values) ? Object.entries(c.values) : [];
    if (values.length) s += ' (' + values.map(([k, v]) => cutText(k, 120) + ' = ' + cutText(JSON.stringify(v), 120)).join(', ') + ')';
    return s;
  }

  // blueprintLine is a blueprint_step event in words, as the record's Formatter writes it: a
  // step's change, or the run's end with the fallback it took.
  function blueprintLine(p) {
    let s = cutText(p.blueprint, 64) + ' run ' + cutText(p.run_id, 100);
    if (!p.step) {
      s += ' ' + cutText(p.status, 32);
      if (p.message) s += ': “' + cutText(p.message, 300) + '”';
      if (p.transfer_to) s += ' → ' + cutText(p.transfer_to, 64);
      if (p.error) s += ' (' + cutText(p.error_code, 64) + ': ' + cutText(p.error, 300) + ')';
      return s;
    }
    s += ' step ' + cutText(p.step, 32) + ' ' + cutText(p.tool, 64) + ' ' + cutText(p.status, 32);
    if (p.condition && typeof p.condition === 'object') s += ' when ' + conditionWords(p.condition);
    if (p.request_id && p.status === 'running') s += ' · request ' + cutText(p.request_id, 200);
    if (p.approval_id) s += ' · approval ' + cutText(p.approval_id, 200);
    if (Number(p.duration_ms) > 0) s += ' (' + Number(p.duration_ms) + ' ms)';
    if (p.error) s += ' · ' + cutText(p.error_code, 64) + ': ' + cutText(p.error, 300);
    return s;
  }

  // runEndLine is how a run ended: its status, the fallback's message and where it sent the
  // user, or its error.
  function runEndLine(end) {
    const status = String(end.status || '?');
    const line = el('div', { class: 'bp-end st-' + status, data: { status } },
      el('span', { class: 'st' }, 'run ' + (runWords[status] || status)));
    if (end.message) line.append(el('span', { class: 'bp-message' }, '“' + cutText(end.message, 400) + '”'));
    if (end.transfer_to) line.append(el('span', { class: 'bp-transfer' }, 'transferred to ', el('b', { class: 'mono' }, cutText(end.transfer_to, 64))));
    if (end.error) line.append(el('span', { class: 'err-code mono' }, cutText(end.error_code || 'ERROR', 64)), el('span', null, cutText(end.error, 400)));
    return line;
  }

  function renderRun(s, run, now) {
    const end = run.end ? run.end.payload : null;
    const status = end ? String(end.status || '?') : 'running';
    const steps = [...run.steps.values()].map((st) => ({ st, v: stepView(st, now) }));
    const times = run.msgs.map(stepAt).filter(Number.isFinite);
    let t0 = times.length ? Math.min(...times) : now;
    for (const { v } of steps) if (Number.isFinite(v.start)) t0 = Math.min(t0, v.start);
    let t1 = end ? stepAt(run.end) : now;
    for (const t of times) t1 = Math.max(t1, t);
    for (const { v } of steps) if (Number.isFinite(v.end)) t1 = Math.max(t1, v.end);
    const span = Math.max(t1 - t0, 10);
    const x = (t) => Math.min(100, Math.max(0, ((t - t0) / span) * 100));

    const block = el('article', { class: 'req bp-run', data: { run: run.id, status } });
    block.append(el('button', {
      type: 'button', class: 'req-head',
      title: 'Show the run\'s blueprint_step messages',
      on: { click: () => showDetail({ kind: 'run', run: run.id }) },
    },
    el('span', { class: 'badge st-' + status }, runWords[status] || status),
    el('span', { class: 'bp-name' }, 'blueprint ', el('b', null, run.blueprint || '?'), run.version ? ' v' + run.version : ''),
    el('span', { class: 'req-id mono' }, 'run ' + run.id),
    el('span', { class: 'req-meta' },
      clock(t0), ' · ', plural(steps.length, 'step', 'steps'),
      ' · ', end ? 'ended in ' + dur(t1 - t0) : 'running for ' + dur(now - t0))));

    const wf = el('div', { class: 'wf', role: 'list' });
    const step = niceStep(span);
    const grid = [];
    for (let t = 0; t <= span + 1e-9; t += step) grid.push(t);
    wf.append(axisRow(span, grid, 'step · tool', 'time'));
    const gridPct = grid.map((t) => (t / span) * 100);
    for (const { st, v } of steps) {
      wf.append(stepRow(run, st, v, x, gridPct));
      if (v.error) {
        wf.append(el('div', { class: 'wf-err', data: { step: st.id } },
          el('span', { class: 'err-code' }, v.error.code || 'ERROR'), v.error.message ? el('span', null, v.error.message) : null));
      }
      if (v.status === 'waiting_approval' && v.approval) {
        wf.append(approvalBox(s, v.approval, el('span', { class: 'apr-what' }, 'Step ' + st.id + ' waits for a person\'s approval:')));
      }
    }
    if (end) wf.append(runEndLine(end));
    else wf.append(el('div', { class: 'bp-end muted small', data: { status: 'running' } }, 'The run has not ended yet.'));
    block.append(wf);
    return block;
  }

  function stepRow(run, st, v, x, gridPct) {
    const track = el('div', { class: 'wf-track' });
    const cond = v.condition ? conditionWords(v.condition) : '';
    if (v.status === 'skipped') {
      // No bar: the step did not run. In its place, why.
      track.append(el('span', { class: 'bp-skip' }, 'skipped' + (cond ? ': ' + cond : '')));
    } else {
      for (const pct of gridPct) {
        const g = el('span', { class: 'gl' });
        g.style.left = pct + '%';
        track.append(g);
      }
    }
    if (v.status !== 'skipped' && Number.isFinite(v.start)) {
      const bar = el('div', { class: 'bar ' + (stepBar[v.status] || 'st-queued') });
      bar.style.left = x(v.start) + '%';
      bar.style.width = Math.max(0, x(v.end) - x(v.start)) + '%';
      track.append(bar);
    }
    // Under the step's status and tool: its place, then the approval it waits for, the
    // condition it ran under, or the request it made.
    let sub = null;
    if (v.approval) sub = el('span', { class: 'bp-approval' }, 'approval ' + v.approval);
    else if (cond && v.status !== 'skipped') sub = el('span', { class: 'bp-cond' }, 'when ' + cond);
    else if (v.requestID) sub = el('span', null, v.requestID);
    const label = el('div', { class: 'wf-label' },
      el('span', { class: 'line' },
        el('span', { class: 'st bp-st-' + v.status }, stepWords[v.status] || v.status),
        el('span', { class: 'tool-name' }, st.tool || '?')),
      el('span', { class: 'call-id mono' }, el('span', { class: 'step-id' }, 'step ' + st.id), sub ? ' · ' : null, sub));
    const info = el('div', { class: 'wf-info' },
      el('span', { class: 'dur' }, v.status === 'skipped' ? '' : v.pending ? dur(v.end - v.start) + '…' : dur(v.ms)));
    const tip = ['step ' + st.id + ' ' + (st.tool || '?'), stepWords[v.status] || v.status];
    if (cond) tip.push('when ' + cond);
    if (v.requestID) tip.push('request ' + v.requestID);
    if (v.approval) tip.push('approval ' + v.approval);
    return el('div', {
      class: 'wf-row bp-step st-' + v.status, role: 'listitem', tabindex: '0',
      data: { step: st.id, tool: st.tool, status: v.status },
      title: tip.join(' · ') + ' — click for its events',
      on: {
        click: () => showDetail({ kind: 'step', run: run.id, step: st.id }),
        keydown: (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); showDetail({ kind: 'step', run: run.id, step: st.id }); } },
      },
    }, label, track, info);
  }

  // ---- approvals ------------------------------------------------------------------------

  // approvalOf is the approval id a call's result waits for: set when its tool's policy parked
  // it (APPROVAL_REQUIRED), else ''.
  function approvalOf(res) {
    if (!res || res.error_code !== 'APPROVAL_REQUIRED' || !res.policy) return '';
    return String(res.policy.approval_id || '');
  }

  // scheduleApprovals reads the session's approvals again shortly (events come in bursts).
  function scheduleApprovals(s) {
    if (s.closed || s.approvalsTimer) return;
    s.approvalsTimer = setTimeout(() => {
      s.approvalsTimer = null;
      loadApprovals(s);
    }, 200);
  }

  // loadApprovals reads the approvals of s the page's caller may see, and redraws them.
  async function loadApprovals(s) {
    let why = '';
    try {
      const resp = await fetch('/v1/approvals?limit=100&session_id=' + encodeURIComponent(s.id), { headers: { Accept: 'application/json' }, cache: 'no-store' });
      if (resp.status === 401) {
        showSignin('Your sign-in has ended; sign in again.');
        return;
      }
      if (resp.ok) {
        const body = await resp.json();
        s.approvals = new Map((Array.isArray(body.approvals) ? body.approvals : []).map((a) => [String(a.id), a]));
      } else {
        const e = await errorText(resp);
        why = 'HTTP ' + resp.status + (e.code ? ' ' + e.code : '') + (e.message ? ' — ' + e.message : '');
      }
    } catch (err) {
      why = 'the gateway is not reachable (' + err.message + ')';
    }
    if (s.closed) return;
    const box = $('approvals-error');
    box.hidden = !why;
    box.textContent = why ? '✗ Could not read the approvals: ' + why : '';
    redrawApprovals(s);
  }

  // redrawApprovals draws the approvals list and the requests whose calls wait for one.
  function redrawApprovals(s) {
    renderApprovals(s);
    for (const [id, r] of s.requests) if (waitsForApproval(r)) s.dirty.add(id);
    for (const run of s.runs.values()) if (run.msgs.some((m) => m.payload.approval_id)) s.runsDirty = true;
    if (s.dirty.size || s.runsDirty) schedule(s);
  }

  // waitsForApproval reports whether a call of r was parked for an approval.
  function waitsForApproval(r) {
    for (const c of r.calls.values()) if (c.results.some((m) => approvalOf(m.payload))) return true;
    const resp = lastOf(r.responses);
    return !!(resp && Array.isArray(resp.payload.results) && resp.payload.results.some(approvalOf));
  }

  function renderApprovals(s) {
    const list = $('approvals-list');
    const focused = document.activeElement;
    const hadFocus = list.contains(focused) && focused.classList.contains('apr-reason');
    clear(list);
    const all = [...s.approvals.values()];
    for (const a of all) {
      const args = typeof a.arguments === 'string' ? a.arguments : JSON.stringify(a.arguments ?? {});
      list.append(el('li', { data: { approval: String(a.id) } },
        el('div', { class: 'apr-call' },
          el('span', { class: 'tool-name' }, String(a.tool || '?')),
          el('span', { class: 'mono apr-args', title: args }, args.length > 200 ? args.slice(0, 199) + '…' : args),
          el('span', { class: 'muted small' }, 'call ', String(a.tool_call_id || ''), ' of ', String(a.request_id || ''),
            a.requester ? ' · by ' + callerName(a.requester) : '',
            Array.isArray(a.approvers) && a.approvers.length ? ' · approvers: ' + a.approvers.join(', ') : '')),
        approvalBox(s, String(a.id))));
    }
    if (hadFocus) refocusReason(list, focused);
    const pending = all.filter((a) => a.state === 'pending').length;
    $('approvals-count').textContent = all.length ? '(' + plural(all.length, 'approval', 'approvals') + ', ' + pending + ' pending)' : '';
    $('approvals').hidden = !all.length && $('approvals-error').hidden;
  }

  // refocusReason puts the focus back in root's reason input of the approval old was for.
  function refocusReason(root, old) {
    const input = [...root.querySelectorAll('.apr-reason')].find((e) => e.dataset.approval === old.dataset.approval);
    if (input) {
      input.focus();
      input.setSelectionRange(input.value.length, input.value.length);
    }
  }

  const approvalWords = {
    pending: '… waiting for approval', approved: '✓ approved', used: '✓ approved and run', denied: '✗ denied', expired: '✗ expired',
  };

  // approvalBox is where approval id stands, with Approve and Deny (and a reason to deny) when
  // the caller may decide it.
  function approvalBox(s, id, ...lead) {
    const a = s.approvals.get(id);
    const state = a ? String(a.state || '') : '';
    const box = el('div', { class: 'approval', data: { approval: id, state: state || 'unknown', canDecide: String(!!(a && a.can_decide)) } }, lead);
    box.append(el('span', { class: 'apr-state apr-' + (state || 'unknown') }, a ? approvalWords[state] || state : 'approval'),
      el('span', { class: 'mono apr-id' }, id));
    if (a) {
      const parts = [];
      if (state === 'pending') {
        const exp = parseTime(a.expires_at);
        if (Number.isFinite(exp)) parts.push('expires at ' + clock(exp).slice(0, 8));
        if (!a.can_decide) parts.push(Array.isArray(a.approvers) && a.approvers.length ? 'for ' + a.approvers.join(' or ') + ' to decide' : 'for its requester to confirm');
      }
      if (a.decided_by) parts.push('by ' + a.decided_by);
      if (a.reason) parts.push('“' + a.reason + '”');
      if (a.run_request_id) parts.push('runs as request ' + a.run_request_id);
      if (parts.length) box.append(el('span', { class: 'apr-meta' }, parts.join(' · ')));
    } else {
      box.append(el('span', { class: 'apr-meta muted' }, 'not readable by this caller (or not loaded yet)'));
    }
    if (a && a.can_decide) {
      const reason = el('input', {
        class: 'apr-reason', type: 'text', maxlength: '1000', autocomplete: 'off', placeholder: 'reason (to deny)',
        'aria-label': 'reason for denying ' + id, data: { approval: id },
        on: { input: (e) => { s.reasons.set(id, e.target.value); markInvalid(e.target, false); } },
      });
      reason.value = s.reasons.get(id) || '';
      // A redraw keeps the reason marked as missing while the note asks for one.
      const asked = s.approvalNotes.get(id);
      if (asked && asked.kind === 'bad' && !reason.value) markInvalid(reason, true);
      box.append(
        el('button', { type: 'button', class: 'primary apr-approve', data: { approval: id }, on: { click: () => decide(s, id, true, box) } }, 'Approve'),
        reason,
        el('button', { type: 'button', class: 'apr-deny', data: { approval: id }, on: { click: () => decide(s, id, false, box) } }, 'Deny'));
    }
    const note = s.approvalNotes.get(id);
    if (note) box.append(el('span', { class: 'apr-note ' + note.kind, role: 'status' }, note.text));
    return box;
  }

  // decide approves or denies approval id (a denial with the reason typed in box), then reads
  // where it stands.
  async function decide(s, id, approve, box) {
    const input = box.querySelector('.apr-reason');
    const reason = (input ? input.value : s.reasons.get(id) || '').trim();
    if (!approve && !reason) {
      markInvalid(input, true);
      if (input) input.focus();
      s.approvalNotes.set(id, { kind: 'bad', text: 'Say why you deny it.' });
      box.querySelector('.apr-note')?.remove();
      box.append(el('span', { class: 'apr-note bad', role: 'status' }, 'Say why you deny it.'));
      return;
    }
    for (const b of box.querySelectorAll('button')) b.disabled = true;
    // What an earlier try said (a reason asked for) no longer stands while this one is sent.
    s.approvalNotes.delete(id);
    box.querySelector('.apr-note')?.remove();
    let note;
    try {
      const resp = await fetch('/v1/approvals/' + encodeURIComponent(id) + '/' + (approve ? 'approve' : 'deny'), {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(reason ? { reason } : {}),
      });
      if (resp.status === 401) {
        showSignin('Your sign-in has ended; sign in again (nothing was decided).');
        return;
      }
      if (resp.ok) {
        const v = await resp.json();
        s.approvals.set(id, v);
        s.reasons.delete(id);
        note = { kind: 'good', text: approve ? 'Approved.' : 'Denied.' };
      } else {
        const e = await errorText(resp);
        note = { kind: 'bad', text: 'Not ' + (approve ? 'approved' : 'denied') + ': HTTP ' + resp.status + (e.code ? ' ' + e.code : '') + (e.message ? ' — ' + e.message : '') };
      }
    } catch (err) {
      note = { kind: 'bad', text: 'Not decided: the gateway is not reachable (' + err.message + ').' };
    }
    if (s.closed) return;
    s.approvalNotes.set(id, note);
    redrawApprovals(s);
    loadApprovals(s);
  }

  // ---- the message log -----------------------------------------------------------------

  function summary(m) {
    const p = m.payload || {};
    switch (m.type) {
      case 'request.v1': return (Array.isArray(p.tool_calls) ? plural(p.tool_calls.length, 'call', 'calls') : '') + (p.intent ? ' — ' + p.intent : '');
      case 'tool_call.v1': return ((p.call && p.call.name) || '') + ' ' + ((p.call && p.call.tool_call_id) || '') + (p.route ? ' → ' + p.route : '') + (p.contract ? ' · contract v' + p.contract.version : '') + (p.policy ? ' · policy: ' + policyWords(p.policy) : '');
      case 'tool_started.v1': return (p.name || '') + ' ' + (p.tool_call_id || '') + ' try ' + (p.attempt ?? '');
      case 'tool_result.v1': return (p.name || '') + ' ' + (p.tool_call_id || '') + ' ' + (p.status || '') + (p.error_code ? ' ' + p.error_code : '') + (p.contract_version ? ' · contract v' + p.contract_version : '') + (p.policy ? ' · policy: ' + policyWords(p.policy) : '');
      case 'policy_decision.v1': return '[policy] ' + policyLine(p);
      case 'blueprint_step.v1': return '[blueprint] ' + blueprintLine(p);
      case 'coordination.v1': return '[coord] ' + coordLine(p);
      case 'response.v1': return (p.status || '') + (Array.isArray(p.results) ? ' (' + plural(p.results.length, 'result', 'results') + ')' : '');
      case 'cancel.v1': return 'cancelled by ' + (p.by || '?') + (p.reason ? ' — ' + p.reason : '');
      case 'llm_decision.v1': return decisionLines(p).map((l) => '[' + l[0] + '] ' + l[1]).join(' · ');
      case 'llm_summary.v1': return '[摘要] ' + summaryLine(p);
      default: return '';
    }
  }

  function appendLog(s, m) {
    if (m.error) s.unreadable++;
    const li = el('li', { class: m.error ? 'bad' : '' },
      el('button', { type: 'button', class: 'log-item', on: { click: () => showDetail({ kind: 'message', msg: m }) } },
        el('span', { class: 'mono muted' }, '#' + (m.seq ?? '?')),
        el('span', { class: 'mono' }, clock(msgTime(m))),
        el('span', { class: 'type' }, m.error ? '✗ unreadable' : String(m.type || '?')),
        el('span', { class: 'mono' }, String(m.request_id || '')),
        el('span', null, m.error ? String(m.error) : summary(m))));
    $('log-list').append(li);
  }

  // ---- detail pane ---------------------------------------------------------------------

  let detailSel = null;

  function showDetail(sel) {
    detailSel = sel;
    refreshDetail();
    $('detail').hidden = false;
    document.body.classList.add('with-detail');
  }

  function hideDetail() {
    detailSel = null;
    $('detail').hidden = true;
    document.body.classList.remove('with-detail');
  }

  function refreshDetail() {
    const s = current;
    const sel = detailSel;
    if (!s || !sel) return;
    let title = '';
    let msgs = [];
    const r = sel.request !== undefined ? s.requests.get(sel.request) : null;
    if (sel.kind === 'message') {
      title = 'Message #' + (sel.msg.seq ?? '?');
      msgs = [sel.msg];
    } else if (sel.kind === 'request' && r) {
      title = 'Request ' + r.id;
      msgs = [r.request, ...r.extraRequests, ...r.responses, ...r.other].filter(Boolean);
    } else if (sel.kind === 'call' && r) {
      const c = r.calls.get(sel.call);
      if (!c) return;
      title = 'Call ' + c.id + (c.name ? ' (' + c.name + ')' : '');
      msgs = [...c.policies, ...c.dispatches, ...c.starts, ...c.results].sort((a, b) => (a.seq ?? 0) - (b.seq ?? 0));
      const resp = lastOf(r.responses);
      if (!c.results.length && resp) msgs.push(resp);
    } else if (sel.kind === 'run' && s.runs.has(sel.run)) {
      const run = s.runs.get(sel.run);
      title = 'Blueprint run ' + run.id;
      msgs = [...run.msgs];
    } else if (sel.kind === 'step' && s.runs.has(sel.run) && s.runs.get(sel.run).steps.has(sel.step)) {
      const st = s.runs.get(sel.run).steps.get(sel.step);
      title = 'Step ' + st.id + (st.tool ? ' (' + st.tool + ')' : '') + ' of run ' + sel.run;
      msgs = [...st.events];
    }
    msgs.sort((a, b) => (Number(a.seq) || 0) - (Number(b.seq) || 0));
    $('detail-title').textContent = title;
    const body = $('detail-body');
    clear(body);
    if (!msgs.length) {
      body.append(el('p', { class: 'muted' }, 'No message recorded for this yet: the call is waiting to be dispatched.'));
    }
    for (const m of msgs) {
      const sender = m.sender ? [m.sender.role, m.sender.instance].filter(Boolean).join(' ') : '';
      body.append(el('section', { class: 'msg' + (m.error ? ' bad' : '') },
        el('h3', null,
          el('span', { class: 'type' }, m.error ? '✗ unreadable message' : String(m.type || '?')),
          el('span', { class: 'muted small' }, ' #' + (m.seq ?? '?') + ' · ' + clock(msgTime(m)) + (sender ? ' · from ' + sender : ''))),
        m.error ? el('p', { class: 'error-box' }, String(m.error)) : null,
        jsonView(s.raw.get(m) || JSON.stringify(m))));
    }
  }

  // ---- the send form -------------------------------------------------------------------

  let callCount = 0;

  function newID(prefix) {
    const rnd = new Uint32Array(1);
    crypto.getRandomValues(rnd);
    return prefix + Date.now().toString(36) + '_' + rnd[0].toString(36).slice(0, 5);
  }

  function addCall(name, args) {
    callCount++; // call ids stay distinct when rows are removed
    const row = el('div', { class: 'call-form' },
      el('label', null, 'Tool name', el('input', { name: 'name', class: 'c-name', autocomplete: 'off', spellcheck: 'false', placeholder: 'e.g. echo' })),
      el('label', null, 'Call id', el('input', { name: 'tool_call_id', class: 'c-id', autocomplete: 'off', spellcheck: 'false' })),
      el('label', { class: 'wide' }, 'Arguments (JSON object)', el('textarea', { name: 'arguments', class: 'c-args mono', rows: '2', spellcheck: 'false' })),
      el('button', { type: 'button', class: 'link remove', title: 'Remove this tool call', on: { click: () => { row.remove(); } } }, 'remove'));
    row.querySelector('.c-name').value = name || '';
    row.querySelector('.c-id').value = 'call_' + callCount;
    row.querySelector('.c-args').value = args || '{}';
    $('f-calls').append(row);
  }

  function openForm() {
    const f = $('send');
    f.hidden = false;
    if (current && !$('f-session').value) $('f-session').value = current.id;
    if (!$('f-request').value) $('f-request').value = newID('req_');
    if (!$('f-calls').children.length) addCall('echo', '{"message":"hello, hermes"}');
    $('f-intent').focus();
  }

  function markInvalid(input, on) {
    if (!input) return;
    if (on) input.setAttribute('aria-invalid', 'true');
    else input.removeAttribute('aria-invalid');
  }

  function fieldInput(field) {
    if (field === 'request_id') return $('f-request');
    if (field === 'session_id') return $('f-session');
    if (field === 'intent') return $('f-intent');
    const m = /^tool_calls\[(\d+)\](?:\.(\w+))?/.exec(field || '');
    if (!m) return null;
    const row = $('f-calls').children[Number(m[1])];
    if (!row) return null;
    const cls = { name: '.c-name', tool_call_id: '.c-id', arguments: '.c-args' }[m[2]];
    return row.querySelector(cls || '.c-name');
  }

  // showSendResult shows the outcome of a send: each of lines is an array of parts.
  function showSendResult(kind, ...lines) {
    const box = $('send-result');
    box.hidden = false;
    box.className = 'send-result ' + kind;
    clear(box);
    for (const parts of lines) if (parts) box.append(parts instanceof Node ? parts : el('div', null, ...parts));
  }

  async function submit(ev) {
    ev.preventDefault();
    for (const i of $('send-form').querySelectorAll('[aria-invalid]')) markInvalid(i, false);
    const rid = $('f-request').value.trim();
    const sid = $('f-session').value.trim();
    const intent = $('f-intent').value;
    const calls = [];
    const rows = [...$('f-calls').children];
    for (let i = 0; i < rows.length; i++) {
      const row = rows[i];
      const argsInput = row.querySelector('.c-args');
      const args = argsInput.value.trim() || '{}';
      try {
        JSON.parse(args);
      } catch (err) {
        markInvalid(argsInput, true);
        argsInput.focus();
        showSendResult('bad', [el('strong', null, '✗ Not sent: '), 'tool_calls[' + i + '].arguments is not valid JSON (' + err.message + ').']);
        return;
      }
      calls.push({ id: row.querySelector('.c-id').value.trim(), name: row.querySelector('.c-name').value.trim(), args });
    }
    // Built as text so the arguments go out byte for byte (JSON.parse would round big integers).
    let body = '{"request_id":' + JSON.stringify(rid);
    if (sid) body += ',"session_id":' + JSON.stringify(sid);
    body += ',"intent":' + JSON.stringify(intent) + ',"tool_calls":[' +
      calls.map((c) => '{"tool_call_id":' + JSON.stringify(c.id) + ',"name":' + JSON.stringify(c.name) + ',"arguments":' + c.args + '}').join(',') + ']';
    if ($('f-serial').checked) body += ',"serial":true';
    body += '}';

    const btn = $('f-submit');
    btn.disabled = true;
    showSendResult('pending', ['Sending ', el('span', { class: 'mono' }, rid), '…']);
    try {
      const resp = await fetch('/v1/route?timeout=3s', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body });
      const session = sid || rid;
      if (resp.ok) {
        const r = await resp.json();
        const st = String(r.status || '');
        showSendResult(st === 'success' ? 'good' : st === 'partial_success' ? 'warn' : 'bad', [
          el('strong', null, responseWords[st] || st), ' — request ', el('span', { class: 'mono' }, rid),
          ' answered', resp.headers.get('X-Hermes-Replayed') === 'true' ? ' (replayed: this request id was sent before)' : '', '.']);
        afterSend(session);
      } else if (resp.status === 401) {
        showSignin('Your sign-in has ended; sign in again (the request was not sent).');
      } else if (resp.status === 504) {
        showSendResult('warn', [el('strong', null, '… Accepted, still running'), ' — request ', el('span', { class: 'mono' }, rid),
          ' is running; the session view shows it as it goes.']);
        afterSend(session);
      } else {
        const e = await errorText(resp);
        markInvalid(fieldInput(e.field), true);
        showSendResult('bad',
          [el('strong', null, '✗ Refused: HTTP ' + resp.status + (e.code ? ' ' + e.code : ''))],
          [el('span', { class: 'err-message' }, e.message)],
          e.field ? ['Field: ', el('code', null, e.field)] : null,
          el('details', null, el('summary', null, 'Response body'), jsonOrText(e.body)));
      }
    } catch (err) {
      showSendResult('bad', [el('strong', null, '✗ Not sent: '), 'the gateway is not reachable (' + err.message + ').']);
    } finally {
      btn.disabled = false;
    }
  }

  function jsonOrText(text) {
    try { JSON.parse(text); return jsonView(text); } catch (_) { return el('pre', { class: 'json' }, text); }
  }

  function afterSend(session) {
    $('f-request').value = newID('req_');
    if (!current || current.id !== session) go(session);
    loadSessions();
  }

  // ---- wiring --------------------------------------------------------------------------

  function tick() {
    // Calls in flight grow with the clock.
    const s = current;
    if (s && !s.closed) {
      for (const [id, r] of s.requests) if (r.request && !r.responses.length) s.dirty.add(id);
      for (const run of s.runs.values()) if (!run.end) s.runsDirty = true;
      if (s.dirty.size || s.runsDirty) schedule(s);
    }
  }

  // ---- signing in ----------------------------------------------------------------------

  // whoami asks who the page is signed in as: the caller, null when the gateway asks for
  // none, or undefined when nobody is signed in.
  async function whoami() {
    const resp = await fetch('/v1/whoami', { headers: { Accept: 'application/json' }, cache: 'no-store' });
    if (resp.status === 401) return undefined;
    if (!resp.ok) {
      const e = await errorText(resp);
      throw new Error('HTTP ' + resp.status + (e.code ? ' ' + e.code : '') + (e.message ? ' — ' + e.message : ''));
    }
    const body = await resp.json();
    return body.caller;
  }

  function showCaller(c) {
    $('who').hidden = !c;
    $('signout').hidden = !c;
    $('who').textContent = c ? 'signed in as ' + (c.name || c.id) + ' (' + c.role + ')' : '';
  }

  let started = false;

  function showSignin(why) {
    clearTimeout(sessionsTimer);
    if (current) {
      current.closed = true;
      if (current.es) current.es.close();
    }
    $('layout').hidden = true;
    $('new-request').hidden = true;
    showCaller(null);
    $('signin').hidden = false;
    const box = $('signin-error');
    box.hidden = !why;
    box.textContent = why || '';
    $('signin-key').focus();
  }

  async function signin(ev) {
    ev.preventDefault();
    const key = $('signin-key').value.trim();
    if (!key) return;
    const btn = $('signin-submit');
    btn.disabled = true;
    try {
      const resp = await fetch('/v1/signin', { method: 'POST', headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ credential: key }) });
      if (!resp.ok) {
        const e = await errorText(resp);
        showSignin(resp.status === 401 ? 'That key or token is not valid.' : 'Could not sign in: HTTP ' + resp.status + (e.message ? ' — ' + e.message : ''));
        return;
      }
      $('signin-key').value = '';
      const body = await resp.json();
      // The page starts afresh, so nothing of an earlier sign-in stays on it.
      if (started) { location.reload(); return; }
      enter(body.caller);
    } catch (err) {
      showSignin('The gateway is not reachable (' + err.message + ').');
    } finally {
      btn.disabled = false;
    }
  }

  async function signout() {
    const why = 'Signed out.';
    try {
      const resp = await fetch('/v1/signout', { method: 'POST' });
      if (!resp.ok) {
        const e = await errorText(resp);
        alert('Could not sign out: HTTP ' + resp.status + (e.message ? ' — ' + e.message : '') + '. Try again.');
        return;
      }
    } catch (err) {
      alert('Could not sign out: the gateway is not reachable (' + err.message + '). Try again.');
      return;
    }
    showSignin(why);
  }

  function enter(caller) {
    $('signin').hidden = true;
    $('layout').hidden = false;
    $('new-request').hidden = false;
    showCaller(caller);
    if (started) return;
    started = true;
    start();
  }

  async function init() {
    $('signin-form').addEventListener('submit', signin);
    $('signout').addEventListener('click', signout);
    let caller;
    for (let wait = 1000; ; wait = Math.min(wait * 2, 15000)) {
      try {
        caller = await whoami();
        break;
      } catch (err) {
        // Busy, unreachable or slowing this address down: say so and ask again.
        showSignin('Cannot tell who you are yet: ' + err.message + '. Retrying in ' + Math.round(wait / 1000) + ' s.');
        await new Promise((ok) => setTimeout(ok, wait));
      }
    }
    if (caller === undefined) showSignin('');
    else enter(caller);
  }

  function start() {
    $('open-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const id = $('open-id').value.trim();
      if (id) go(id);
    });
    $('new-request').addEventListener('click', openForm);
    $('send-close').addEventListener('click', () => { $('send').hidden = true; });
    $('f-add-call').addEventListener('click', () => addCall('', '{}'));
    $('send-form').addEventListener('submit', submit);
    $('detail-close').addEventListener('click', hideDetail);
    document.addEventListener('keydown', (e) => { if (e.key === 'Escape') hideDetail(); });
    window.addEventListener('hashchange', onHash);
    setInterval(tick, 250);
    setInterval(renderSessions, 10000); // keep "ago" fresh between loads
    onHash();
    loadSessions();
  }

  init();
})();
