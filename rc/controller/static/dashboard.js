// rc dashboard: one page, no dependencies, no build step (README "Dashboard and metrics").
// Every string that comes from the controller is inserted as text (textContent,
// text nodes, setAttribute on inert attributes): this file never builds markup
// from strings, and what is not printable is shown as an escape (visible), as
// the CLI shows it. The token lives in sessionStorage only.
"use strict";
(() => {
  const TOKEN_KEY = "rc_token";
  const POLL_MS = 5000;          // refresh this often while the live stream is down
  const SAFETY_POLL_MS = 30000;  // ... and this often while it is up (heals a missed nudge)
  const STREAM_RETRY_MS = 5000;  // reopen a stream the browser gave up on
  const STALE_MS = 15000;        // no good refresh for this long: the page says "stale"
  const REFRESH_MIN_MS = 1000;   // at most one refresh a second, however busy the fleet
  const FEED_MAX = 200;          // feed entries kept
  const FEED_SEED = 100;         // feed entries loaded at start (from the events table)
  const RECENT_FETCH = 30;       // jobs fetched for "Recent jobs"
  const RECENT_SHOW = 10;
  const EXPLAIN_MAX = 10;        // queued jobs explained in the queue list
  const EXPLAIN_EVERY_MS = 3000;
  const USAGE_EVERY_MS = 60000;   // the usage picture is redrawn at most once a minute
  const USAGE_DAYS = 14;
  const LOG_KEEP = 64 * 1024;    // characters of a log tail kept on screen
  const LOG_RETRY_MS = 2000;
  const SVG_NS = "http://www.w3.org/2000/svg";

  // The controller's words for every device state, quarantine reason, job state
  // and event kind (rc/controller/wording.py), put here when the page is
  // assembled (rc/controller/dashboard.py): this file keeps no copy of them.
  const WORDS = /*@words*/null;
  const STATES = WORDS.device_states;             // state -> {word, icon}
  const STATE_ORDER = WORDS.device_order;
  const QUARANTINE = WORDS.quarantine;            // reason -> {headline, why, advice}
  const JOB_WORDS = Object.fromEntries(Object.entries(WORDS.jobs).map(([k, v]) => [k, v.word]));
  const JOB_TONE = Object.fromEntries(Object.entries(WORDS.jobs).map(([k, v]) => [k, v.tone]));
  const TERMINAL = new Set(Object.keys(WORDS.jobs).filter((k) => WORDS.jobs[k].terminal));
  const EVENT_WORDS = WORDS.events;               // kind -> {word, tone}

  const ICONS = {
    check: ["M3.5 8.5l3 3 6-7", false],
    play: ["M5 3.2v9.6L12.6 8z", true],
    question: ["M5.8 5.9a2.3 2.3 0 1 1 3.3 2.1c-.7.4-1.1.8-1.1 1.6v.5M8 12.6v.1", false],
    cross: ["M4.5 4.5l7 7M11.5 4.5l-7 7", false],
    pause: ["M5.5 3.5v9M10.5 3.5v9", false],
  };

  const S = {
    token: "", me: null, snap: null, fetchedAt: 0, recent: [],
    events: [], lastEventId: 0, explains: new Map(), explainedAt: 0, explainTimer: null, usageAt: 0, usageTimer: null,
    es: null, sseOpen: false, streamOpenedAt: 0,
    lastOk: 0, lastAttempt: 0, failed: false, inflight: null, again: false, refreshTimer: null,
    panel: null, back: null, panelAbort: null, timers: [],
  };

  const $ = (id) => document.getElementById(id);
  const collator = new Intl.Collator(undefined, { numeric: true, sensitivity: "base" });

  // ---------------------------------------------------------------- DOM helpers

  // h("div", {class: "x", onclick: fn}, "text", child): strings become text nodes.
  function h(tag, props, ...kids) {
    const el = document.createElement(tag);
    if (props) {
      for (const [k, v] of Object.entries(props)) {
        if (v === null || v === undefined || v === false) continue;
        if (k === "class") el.className = v;
        else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
        else el.setAttribute(k, v === true ? "" : String(v));
      }
    }
    append(el, kids);
    return el;
  }

  function append(el, kids) {
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.append(kid instanceof Node ? kid : visible(String(kid)));
    }
    return el;
  }

  // What someone else wrote (a hold reason, a command, a label, a kill or
  // drain reason) with every character that is not printable shown as an
  // escape, as the CLI shows it (rc.cli.output.visible, held to the same
  // output by a browser test): \n, \t, \r; \xNN, \uNNNN, \UNNNNNNNN for the
  // rest of C0, DEL, C1, bidi overrides, line separators and other format,
  // separator (but the space), private-use and unassigned characters (what
  // Python's str.isprintable refuses). Every string shown goes through it
  // (append); a multi-line text (a usage sheet) through escapeControls.
  const INVISIBLE = /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]/gu;
  const NAMED = { "\n": "\\n", "\t": "\\t", "\r": "\\r" };

  function escapeChar(c) {
    if (NAMED[c]) return NAMED[c];
    const n = c.codePointAt(0);
    const hex = (w) => n.toString(16).padStart(w, "0");
    return n < 0x100 ? `\\x${hex(2)}` : n < 0x10000 ? `\\u${hex(4)}` : `\\U${hex(8)}`;
  }

  function visible(text) {
    return text.replace(INVISIBLE, (c) => (c === " " ? c : escapeChar(c)));
  }

  // The same, keeping newlines, tabs and carriage returns (rc.cli.output.escape_controls).
  function escapeControls(text) {
    return text.replace(INVISIBLE, (c) => (c === " " || NAMED[c] ? c : escapeChar(c)));
  }

  function icon(name) {
    const [d, filled] = ICONS[name];
    const svg = document.createElementNS(SVG_NS, "svg");
    svg.setAttribute("viewBox", "0 0 16 16");
    svg.setAttribute("aria-hidden", "true");
    const path = document.createElementNS(SVG_NS, "path");
    path.setAttribute("d", d);
    path.setAttribute("fill", filled ? "currentColor" : "none");
    path.setAttribute("stroke", "currentColor");
    path.setAttribute("stroke-width", filled ? "1" : "2");
    path.setAttribute("stroke-linecap", "round");
    path.setAttribute("stroke-linejoin", "round");
    svg.append(path);
    return svg;
  }

  function pill(key, text) {
    return h("span", { class: `pill s-${key}` }, icon(STATES[key].icon), text || STATES[key].word);
  }

  // An element whose text is recomputed every second.
  function ticking(tag, cls, fn) {
    const el = h(tag, { class: `${cls || ""} ticks` });
    el._tick = () => { el.textContent = visible(fn()); };
    el._tick();
    return el;
  }

  // A clickable row (keyboard too).
  function clickable(el, fn) {
    el.setAttribute("role", "button");
    el.setAttribute("tabindex", "0");
    el.addEventListener("click", (ev) => { if (!ev.target.closest("button.ref")) fn(); });
    el.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); fn(); }
    });
    return el;
  }

  function ref(text, fn) {
    return h("button", { class: "ref", type: "button", onclick: (ev) => { ev.stopPropagation(); fn(); } }, text);
  }

  // ---------------------------------------------------------------- formatting

  // The page's own short form of a duration, at most two units ("1h 5m",
  // "3m 20s"), for counters that tick; the CLI's exact form is another
  // (rc.proto.duration.format_duration), not a copy of this one.
  function dur(seconds) {
    let s = Math.max(0, Math.floor(seconds));
    if (s < 60) return `${s}s`;
    let m = Math.floor(s / 60); s %= 60;
    if (m < 60) return m < 10 && s ? `${m}m ${s}s` : `${m}m`;
    let hr = Math.floor(m / 60); m %= 60;
    if (hr < 24) return m ? `${hr}h ${m}m` : `${hr}h`;
    const d = Math.floor(hr / 24); hr %= 24;
    return hr ? `${d}d ${hr}h` : `${d}d`;
  }

  function ago(seconds) { return seconds < 5 ? "just now" : `${dur(seconds)} ago`; }

  function clock(ms) {
    const d = new Date(ms);
    const hm = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    const today = new Date();
    if (d.toDateString() === today.toDateString()) return hm;
    return `${d.toLocaleDateString([], { weekday: "short", month: "short", day: "numeric" })} ${hm}`;
  }

  function when(epochSeconds) {
    if (!epochSeconds) return "—";
    return `${new Date(epochSeconds * 1000).toLocaleString()} (${ago(Date.now() / 1000 - epochSeconds)})`;
  }

  function bytes(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return `${n >= 10 || i === 0 ? Math.round(n) : n.toFixed(1)} ${units[i]}`;
  }

  function memory(value) {
    const m = /^(\d+)\s*(M|MiB)$/i.exec(value);
    return m ? bytes(Number(m[1]) * 1024 * 1024) : value;
  }

  function ordinal(n) {
    const s = ["th", "st", "nd", "rd"], v = n % 100;
    return n + (s[(v - 20) % 10] || s[v] || s[0]);
  }

  function plural(n, word) { return `${n} ${word}${n === 1 ? "" : "s"}`; }

  function commandText(argv) { return (argv || []).map((a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : JSON.stringify(a))).join(" "); }

  // A job's id as the lists show it, with its name (--name) when it has one.
  function jobLabel(j) {
    return j.name ? `#${j.id} ${j.name}` : `#${j.id}`;
  }

  // What a job (or a device's holder) runs, as the rc listings say it
  // (rc.cli.output.job_what): a hold's reason; a copy job's label (only the
  // controller gives one, "rc cp SRC DST": rc.proto.copyjob.is_copy_label);
  // else its command line, its reason (free text) beside it, never instead.
  function isCopyLabel(j) {
    if (j.kind === "hold" || (j.stdio !== undefined && j.stdio !== "pipe")) return false;
    return (j.reason || "").startsWith("rc cp ");
  }

  function jobWhat(j) {
    if (j.kind === "hold") return `hold: ${j.reason || ""}`;
    if (isCopyLabel(j)) return j.reason;
    const cmd = commandText(j.command);
    return j.reason ? `${cmd} (${j.reason})` : cmd;
  }

  // Why a job ended, in words that follow its state (rc.cli.output.end_reason):
  // "killed by NAME[ (admin)][: WHY]" reads "by NAME: WHY" (the actor first,
  // so cutting the free text never hides who), the worker's fixed reasons are
  // reworded, anything else is shown as it is. A browser test
  // (tests/e2e/test_dashboard.py) holds the two to the same words.
  const KILLED_BY = /^killed by ([^\s:]+(?: \(token [^\s:()]+\))?)( \(admin\))?(?:: ([\s\S]*))?$/;
  const REWORDED = [
    [/^idle: no output for (\S+)$/, (m) => `no output for ${m[1]} (idle timeout)`],
    [/^max_runtime exceeded \(([^)]*)\)$/, (m) => `ran past its max runtime of ${m[1]}`],
    [/^signal: (\S+)$/, (m) => `signal ${m[1]}`],
    [/^no-wait: no device was free$/, () => "no device was free (--no-wait)"],
  ];

  function endReason(j) {
    const reason = (j.kill_reason || "").trim();
    const m = KILLED_BY.exec(reason);
    if (!m) {
      for (const [re, words] of REWORDED) {
        const hit = re.exec(reason);
        if (hit) return words(hit);
      }
      return reason;
    }
    const who = `by ${m[1]}${m[2] ? ", an admin" : ""}`;
    let why = (m[3] || "").trim();
    if (!why && !j.started_at) why = "cancelled while queued";
    return why ? `${who}: ${why}` : who;
  }

  function stripAnsi(text) { return text.replace(/\x1b\[[0-9;?]*[ -/]*[@-~]/g, ""); }

  // Seconds since the snapshot was fetched (elapsed counters tick locally).
  function sinceFetch() { return (Date.now() - S.fetchedAt) / 1000; }

  // ---------------------------------------------------------------- API

  async function api(path, opts = {}) {
    const headers = S.token ? { Authorization: `Bearer ${S.token}` } : {};
    let body;
    if (opts.body !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(opts.body);
    }
    const r = await fetch(path, { method: opts.method || "GET", headers, body, cache: "no-store" });
    const text = await r.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
    if (!r.ok) {
      const err = new Error((data && data.message) || `HTTP ${r.status} from ${path}`);
      err.status = r.status;
      err.code = data && data.error;
      throw err;
    }
    return data;
  }

  // ---------------------------------------------------------------- model helpers

  // The key a device is drawn with: its state, or "draining" for a free one being drained.
  function viewState(v) {
    const d = v.device;
    if (d.draining && d.state === "ready") return "draining";
    return d.state;
  }

  // Effective labels: declared wins over detected.
  function labelMap(d) {
    const out = {};
    for (const l of d.labels || []) {
      if (!out[l.key] || l.source === "declared") out[l.key] = l;
    }
    return out;
  }

  // The few labels a person looks for first: model and memory, then declared ones.
  function keyLabels(d) {
    const m = labelMap(d);
    const out = [];
    const shown = new Set(["model", "gpu_model", "vram", "memory", "vram_free", "mem_total_bytes",
      "cpus", "kind", "vendor", "driver", "uuid", "disk_free_bytes", "kernel"]);
    const model = m.model || m.gpu_model;
    if (model) out.push(["", model.value, model]);
    const mem = m.vram || m.memory;
    if (mem) out.push(["", memory(mem.value), mem]);
    else if (m.mem_total_bytes && /^\d+$/.test(m.mem_total_bytes.value)) {
      out.push(["RAM ", bytes(Number(m.mem_total_bytes.value)), m.mem_total_bytes]);
    }
    const extra = Object.values(m)
      .filter((l) => l.source === "declared" && !shown.has(l.key))
      .sort((a, b) => collator.compare(a.key, b.key))
      .slice(0, 3);
    for (const l of extra) out.push([`${l.key} `, l.value, l]);
    return out;
  }

  // A label ("alice", "alice (token laptop)") is for people; whether a job
  // is the viewer's is its owner, a principal (token:ID, uid:N), compared
  // with the viewer's (a controller from before principals: by label).
  function isMine(name) { return S.me && name && name === (S.me.label || S.me.name); }
  function ownsJob(j) {
    if (!S.me) return false;
    return j.owner && S.me.principal ? j.owner === S.me.principal : isMine(j.submitter);
  }

  function youBadge(name) { return isMine(name) ? h("span", { class: "you" }, "you") : null; }
  function youJob(j) { return ownsJob(j) ? h("span", { class: "you" }, "you") : null; }

  // The Unix user a job runs as, where its submitter's label does not say it.
  function asUser(j) {
    const u = j.unix_user;
    return u && u !== j.submitter && !j.submitter.startsWith(`${u} (token `) ? ` (as ${u})` : "";
  }

  function allDevices() { return S.snap ? S.snap.devices : []; }

  function countStates() {
    const c = Object.fromEntries(STATE_ORDER.map((k) => [k, 0]));
    for (const v of allDevices()) c[viewState(v)] += 1;
    return c;
  }

  // ---------------------------------------------------------------- rendering: header

  function renderSummary() {
    const c = countStates();
    const total = allDevices().length;
    const q = S.snap.queued.length;
    const parts = [];
    parts.push(h("strong", null, `${c.ready} of ${plural(total, "device")}`), " free");
    if (c.busy) parts.push(", ", h("strong", null, c.busy), " in use");
    if (c.unhealthy) parts.push(", ", h("strong", null, c.unhealthy), " out of the pool");
    if (c.unknown) parts.push(", ", h("strong", null, c.unknown), " not reporting");
    if (c.draining) parts.push(", ", h("strong", null, c.draining), " draining");
    parts.push(". ");
    if (q) {
      const longest = Math.max(...Object.values(S.snap.queued_waiting_seconds || { x: 0 }));
      parts.push(h("strong", null, plural(q, "job")), ` waiting (longest ${dur(longest + sinceFetch())}).`);
    } else {
      parts.push("No job is waiting.");
    }
    $("summary").replaceChildren(...parts);
    const counts = STATE_ORDER.filter((k) => k === "ready" || c[k]).map((k) =>
      h("span", { class: `pill s-${k} count-chip`, title: `${c[k]} ${STATES[k].word.toLowerCase()}` },
        icon(STATES[k].icon), `${c[k]} ${STATES[k].word}`));
    $("counts").replaceChildren(...counts);
  }

  function renderConn() {
    const el = $("conn");
    const age = S.lastOk ? (Date.now() - S.lastOk) / 1000 : Infinity;
    let cls, text, title;
    if (!S.lastOk || S.failed || age * 1000 > STALE_MS) {
      cls = "stale";
      text = S.lastOk ? `Stale · ${dur(age)} old` : "Stale";
      title = "Cannot reach the controller; what you see may be out of date. Retrying.";
    } else if (S.sseOpen) {
      cls = "live"; text = "Live"; title = "Live updates are on.";
    } else {
      cls = "polling"; text = `Polling · ${dur(age)} ago`;
      title = `The live stream is down; refreshing every ${POLL_MS / 1000}s.`;
    }
    el.className = `conn ${cls}`;
    el.textContent = text;
    el.title = title;
    const stale = cls === "stale" && S.snap !== null;
    document.body.classList.toggle("stale", stale);
    const banner = $("stale-banner");
    banner.hidden = !stale;
    if (stale) {
      banner.textContent = `Stale: the controller cannot be reached. This is what it said at ${clock(S.lastOk)} (${ago(age)}); retrying.`;
    }
  }

  // ---------------------------------------------------------------- rendering: fleet

  function renderFleet() {
    const hosts = new Map();
    for (const v of allDevices()) {
      if (!hosts.has(v.device.host)) hosts.set(v.device.host, []);
      hosts.get(v.device.host).push(v);
    }
    const names = [...hosts.keys()].sort(collator.compare);
    const cards = names.map((host) => {
      const devs = hosts.get(host).sort((a, b) => collator.compare(a.device.name, b.device.name));
      const free = devs.filter((v) => viewState(v) === "ready").length;
      const beat = Math.min(...devs.map((v) => v.heartbeat_age_seconds ?? Infinity));
      const silent = devs.some((v) => v.device.state === "unknown");
      // Heartbeats refresh nothing on the page (only state changes do), so a
      // healthy host says "reporting"; the age matters once the worker is silent.
      const meta = silent
        ? ticking("span", "host-meta warn", () => `worker silent for ${dur(beat + sinceFetch())}`)
        : h("span", { class: "host-meta" }, "worker reporting");
      return h("div", { class: "host", "data-host": host },
        h("div", { class: "host-head" },
          h("span", { class: "host-name" }, host),
          h("span", { class: "host-meta" }, `${free} of ${devs.length} free`),
          meta),
        devs.map(deviceRow));
    });
    if (!cards.length) {
      cards.push(h("div", { class: "panel empty" }, "No devices yet. Start a worker on a GPU host: rc worker --controller URL --token-file FILE."));
    }
    $("fleet").replaceChildren(...cards);
  }

  function deviceRow(v) {
    const d = v.device;
    const key = viewState(v);
    const chips = keyLabels(d).map(([k, val, l]) =>
      h("span", { class: "chip", title: `${l.key} = ${l.value} (${l.source})` }, k ? h("b", null, k) : null, val));
    const time = deviceTime(v, key);
    const row = h("div", { class: "dev", "data-device": d.id, "data-state": d.state },
      h("span", { class: `rail s-${key}` }),
      h("span", null, pill(key)),
      h("div", { class: time ? "dev-main" : "dev-main wide" },
        h("div", { class: "dev-title" }, h("span", { class: "dev-name" }, d.name), h("span", { class: "chips" }, chips)),
        deviceLine(v, key)),
      time);
    return clickable(row, () => openDevice(d.id));
  }

  function deviceLine(v, key) {
    const d = v.device;
    if (d.state === "unhealthy") {
      const q = QUARANTINE[d.quarantine_reason] || QUARANTINE[""];
      const line = h("div", { class: "dev-line bad" }, h("b", null, q.headline));
      if (d.quarantine_detail) line.append(": ", h("q", null, d.quarantine_detail));
      return line;
    }
    if (v.holder) {
      const what = v.kind === "hold"
        ? ["holds it", v.reason ? [": ", h("span", null, v.reason)] : null]
        : ["· ", ref(`job ${v.job_id}`, () => openJob(v.job_id)), " · ", h("span", { class: "cmd" }, jobWhat(v))];
      const line = h("div", { class: "dev-line" }, h("b", null, v.holder), youBadge(v.holder), " ", what);
      if (d.draining) line.append(" · draining: no new job after this one");
      if (d.state === "unknown") line.prepend("Worker silent; lease kept by ");
      return line;
    }
    if (key === "draining") {
      return h("div", { class: "dev-line" }, "No new job starts here", d.drain_reason ? [": ", d.drain_reason] : ".");
    }
    if (d.state === "unknown") {
      return h("div", { class: "dev-line" }, "Its worker is silent; not handed out until it reports again.");
    }
    return h("div", { class: "dev-line" }, "Free: the next matching job starts here.");
  }

  function deviceTime(v, key) {
    const box = h("div", { class: "dev-time" });
    if (v.elapsed_seconds !== null && v.elapsed_seconds !== undefined && v.holder) {
      const max = v.max_runtime_seconds;
      box.append(ticking("div", "", () => {
        const el = v.elapsed_seconds + sinceFetch();
        return max ? `${dur(el)} of ${dur(max)}` : `${dur(el)}, no time limit`;
      }));
      if (max) {
        const fill = h("div", { class: "fill" });
        const bar = h("div", { class: "bar", title: "time used of its maximum runtime" }, fill);
        const until = ticking("div", "", () => {
          const left = max - (v.elapsed_seconds + sinceFetch());
          const end = Date.now() + left * 1000;
          return left > 0 ? `until ${clock(end)} at most` : `over its limit by ${dur(-left)}`;
        });
        fill._tick = () => {
          const frac = (v.elapsed_seconds + sinceFetch()) / max;
          fill.style.width = `${Math.min(100, Math.max(2, frac * 100)).toFixed(1)}%`;
          fill.classList.toggle("warn", frac >= 0.8 && frac < 1);
          fill.classList.toggle("over", frac >= 1);
        };
        fill.classList.add("ticks");
        fill._tick();
        box.append(bar, until);
      }
    } else if (key === "unknown") {
      box.append(ticking("div", "", () => `silent ${dur((v.heartbeat_age_seconds || 0) + sinceFetch())}`));
    }
    // A hold's idle clock and when the idle rule releases it (README "Holds: the idle rule").
    const idle = v.kind === "hold" && S.snap && S.snap.holds_idle ? S.snap.holds_idle[String(v.job_id)] : null;
    if (idle && idle.idle_seconds !== null && idle.idle_seconds !== undefined) {
      // whichever ends the hold first: the idle rule, or its ttl
      const max = v.max_runtime_seconds;
      box.append(ticking("div", "idle", () => {
        const el = idle.idle_seconds + sinceFetch();
        const left = idle.timeout_seconds - el;
        const ttlLeft = max && v.elapsed_seconds !== null && v.elapsed_seconds !== undefined
          ? max - (v.elapsed_seconds + sinceFetch()) : Infinity;
        if (ttlLeft <= left) {
          const end = Date.now() + Math.max(0, ttlLeft) * 1000;
          return `idle ${dur(el)} · its ttl ends first, at ${clock(end)}`;  // as rc show says
        }
        const end = Date.now() + Math.max(0, left) * 1000;
        return `idle ${dur(el)} · released at ${clock(end)} if unused`;
      }));
    }
    return box.childNodes.length ? box : null;
  }

  // ---------------------------------------------------------------- rendering: side column

  // A job's devices, each host named once ("box:gpu0,gpu1"; rc's device_list).
  function devs(j) {
    const ids = (j.device_ids && j.device_ids.length) ? j.device_ids : (j.device_id ? [j.device_id] : []);
    const out = [];
    let host = null;
    for (const d of ids) {
      const i = d.lastIndexOf(":");
      const [hh, name] = [d.slice(0, i), d.slice(i + 1)];
      out.push(hh === host ? name : (out.length ? ` ${d}` : d));
      host = hh;
    }
    return out.join(",");
  }

  function jobTarget(j) {
    if (!j.selector) return `on ${devs(j)}`;
    return (j.count || 1) > 1 ? `wants ${j.count} devices of one host matching ${j.selector}` : `wants ${j.selector}`;
  }

  function waitedOf(j) { return (S.snap.queued_waiting_seconds[String(j.id)] || 0) + sinceFetch(); }

  function firstReason(id) {
    const ex = S.explains.get(id);
    return ex && ex.reasons && ex.reasons.length ? ex.reasons[0] : null;
  }

  // Every term of a queued job's effective priority ("priority 0 + aging 2 - fair share 3 (...) = -1"),
  // when there is more to it than its priority.
  function priorityTerms(id) {
    const ex = S.explains.get(id);
    return ex && ex.priority && /[+-] (aging|fair share)/.test(ex.priority) ? ex.priority : null;
  }

  function queueItem(j) {
    const pos = S.snap.queue_positions[String(j.id)];
    const why = firstReason(j.id);
    const terms = priorityTerms(j.id);
    const item = h("div", { class: "item", "data-job": j.id },
      h("div", { class: "item-top" },
        h("span", { class: "jid" }, jobLabel(j)),
        h("span", { class: "grow" }, h("b", null, j.submitter), asUser(j), youJob(j), ` · ${jobTarget(j)}`),
        ticking("span", "num", () => `waiting ${dur(waitedOf(j))}`)),
      h("div", { class: "item-sub" },
        pos ? `${ordinal(pos)} in line` : "in line",
        j.priority ? ` · priority ${j.priority}` : "",
        j.kind === "hold" ? ` · hold: ${j.reason}` : ""),
      why ? h("div", { class: "item-why" }, why) : null,
      terms ? h("div", { class: "item-why priority-terms" }, `Effective ${terms}`) : null);
    return clickable(item, () => openJob(j.id));
  }

  // Fill a list (and its count) with items, or say that it is empty.
  function fillList(id, items, empty, countId) {
    if (countId) $(countId).textContent = items.length ? String(items.length) : "";
    $(id).replaceChildren(...(items.length ? items : [h("p", { class: "empty" }, empty)]));
  }

  function renderQueue() {
    fillList("queue", S.snap.queued.map(queueItem), "Nothing is waiting.", "queue-count");
  }

  function runningItem(j) {
    const v = allDevices().find((x) => x.job_id === j.id);
    const item = h("div", { class: "item", "data-job": j.id },
      h("div", { class: "item-top" },
        h("span", { class: "jid" }, jobLabel(j)),
        h("span", { class: "grow" }, h("b", null, j.submitter), asUser(j), youJob(j), ` on ${devs(j)}`),
        v && v.elapsed_seconds !== null ? ticking("span", "num", () => dur(v.elapsed_seconds + sinceFetch())) : h("span", { class: `js js-${j.state}` }, JOB_WORDS[j.state])),
      h("div", { class: "item-sub" }, j.kind === "hold" ? jobWhat(j) : h("span", { class: "mono" }, jobWhat(j))));
    return clickable(item, () => openJob(j.id));
  }

  function renderRunning() {
    fillList("running", S.snap.jobs.map(runningItem), "No job is running.", "running-count");
  }

  function outcome(j) {
    if (j.state === "succeeded") return "exit 0";
    if (j.state === "failed") return j.exit_code !== null && j.exit_code !== undefined ? `exit ${j.exit_code}` : "failed";
    if (!TERMINAL.has(j.state)) return jobWhat(j);
    const why = endReason(j);
    if (!why) return JOB_WORDS[j.state];
    return why.startsWith("by ") ? `${JOB_WORDS[j.state]} ${why}` : why;
  }

  // When, for a job in a list of recent ones: how long ago it finished; for
  // one still running (a device's recent jobs include it), for how long.
  function recentWhen(j) {
    const now = Date.now() / 1000;
    if (j.finished_at) return ago(now - j.finished_at);
    if (j.started_at) return `for ${dur(now - j.started_at)}`;
    return JOB_WORDS[j.state];
  }

  function recentItem(j) {
    const took = j.started_at && j.finished_at ? dur(j.finished_at - j.started_at) : null;
    const item = h("div", { class: "item", "data-job": j.id },
      h("div", { class: "item-top" },
        h("span", { class: "jid" }, jobLabel(j)),
        h("span", { class: `js js-${j.state}` }, JOB_WORDS[j.state]),
        h("span", { class: "grow" }, h("b", null, j.submitter), asUser(j), youJob(j), j.device_id ? ` · ${devs(j)}` : ""),
        ticking("span", "num", () => recentWhen(j))),
      h("div", { class: "item-sub" }, outcome(j), took ? ` · ran ${took}` : ""));
    return clickable(item, () => openJob(j.id));
  }

  function renderRecent() {
    const done = S.recent.filter((j) => TERMINAL.has(j.state)).slice(0, RECENT_SHOW);
    fillList("recent", done.map(recentItem), "No job has finished yet.");
  }

  function renderMine() {
    if (!S.me) return;
    const mine = ownsJob;
    const items = [];
    for (const j of S.snap.jobs.filter(mine)) {
      const v = allDevices().find((x) => x.job_id === j.id);
      items.push(clickable(h("div", { class: "item", "data-job": j.id },
        h("div", { class: "item-top" }, h("span", { class: "jid" }, jobLabel(j)),
          h("span", { class: "grow" }, j.kind === "hold" ? "holds " : `is ${JOB_WORDS[j.state]} on `, h("b", null, devs(j))),
          v && v.elapsed_seconds !== null ? ticking("span", "num", () => {
            const el = v.elapsed_seconds + sinceFetch();
            return v.max_runtime_seconds ? `${dur(el)} of ${dur(v.max_runtime_seconds)}` : dur(el);
          }) : null)), () => openJob(j.id)));
    }
    for (const j of S.snap.queued.filter(mine)) {
      const pos = S.snap.queue_positions[String(j.id)];
      const why = firstReason(j.id);
      items.push(clickable(h("div", { class: "item", "data-job": j.id },
        h("div", { class: "item-top" }, h("span", { class: "jid" }, jobLabel(j)),
          h("span", { class: "grow" }, `is waiting${pos ? `, ${ordinal(pos)} in line` : ""} · ${jobTarget(j)}`),
          ticking("span", "num", () => dur(waitedOf(j)))),
        why ? h("div", { class: "item-why" }, why) : null), () => openJob(j.id)));
    }
    const hour = Date.now() / 1000 - 3600;
    for (const j of S.recent.filter((x) => mine(x) && TERMINAL.has(x.state) && x.finished_at > hour).slice(0, 3)) {
      items.push(clickable(h("div", { class: "item", "data-job": j.id },
        h("div", { class: "item-top" }, h("span", { class: "jid" }, jobLabel(j)),
          h("span", { class: "grow" }, h("span", { class: `js js-${j.state}` }, JOB_WORDS[j.state]),
            j.device_id ? ` on ${devs(j)}` : "", ` · ${outcome(j)}`),
          ticking("span", "num", () => ago(Date.now() / 1000 - j.finished_at)))), () => openJob(j.id)));
    }
    $("mine-box").hidden = items.length === 0;
    $("mine").replaceChildren(...items);
  }

  function renderFeed() {
    const items = S.events.slice().reverse().map((e) => {
      const { word, tone } = EVENT_WORDS[e.kind] || { word: e.kind, tone: "info" };
      return h("li", { "data-event": e.id },
        ticking("span", "when", () => ago(Date.now() / 1000 - e.at)),
        h("div", { class: "what", title: new Date(e.at * 1000).toLocaleString() },
          h("span", { class: `kind ${tone}` }, word),
          e.device_id ? ref(e.device_id, () => openDevice(e.device_id)) : null,
          e.device_id && e.job_id ? " " : null,
          e.job_id ? ref(`job ${e.job_id}`, () => openJob(e.job_id)) : null,
          e.text ? [e.device_id || e.job_id ? " — " : "", e.text] : null,
          e.actor && !(e.text || "").includes(e.actor) ? ` (${e.actor})` : null));
    });
    $("feed").replaceChildren(...(items.length ? items : [h("li", { class: "empty" }, "Nothing has happened yet.")]));
  }

  function renderAll() {
    renderSummary();
    renderFleet();
    renderQueue();
    renderRunning();
    renderRecent();
    renderMine();
  }

  function tick() {
    for (const el of document.querySelectorAll(".ticks")) el._tick();
  }

  // ---------------------------------------------------------------- data flow

  function requestRefresh() {
    if (S.refreshTimer) return;
    const wait = Math.max(60, S.lastAttempt + REFRESH_MIN_MS - Date.now());
    S.refreshTimer = setTimeout(() => { S.refreshTimer = null; refresh(); }, wait);
  }

  function refresh() {
    if (S.inflight) { S.again = true; return S.inflight; }
    S.lastAttempt = Date.now();
    S.inflight = (async () => {
      try {
        const [st, recent] = await Promise.all([api("/v1/state"), api(`/v1/jobs?limit=${RECENT_FETCH}`)]);
        S.snap = st;
        S.recent = recent.jobs;
        S.fetchedAt = S.lastOk = Date.now();
        S.failed = false;
        $("app").hidden = false;
        renderAll();
        explainSoon();
        usageSoon();
        refreshPanel();
      } catch (e) {
        S.failed = true;
        if (e.status === 401) signOut(`The controller refused the token: ${e.message}`);
      } finally {
        S.inflight = null;
        renderConn();
        if (S.again) { S.again = false; requestRefresh(); }
      }
    })();
    return S.inflight;
  }

  function usageSoon() {
    if (S.usageTimer) return;
    const wait = Math.max(0, S.usageAt + USAGE_EVERY_MS - Date.now());
    S.usageTimer = setTimeout(loadUsage, wait);
  }

  // The usage picture is drawn by the controller (GET /v1/usage/chart.svg): an SVG with no
  // script or style, parsed as XML and adopted as nodes (never as markup in an HTML context).
  async function loadUsage() {
    S.usageAt = Date.now();
    try {
      const r = await fetch(`/v1/usage/chart.svg?days=${USAGE_DAYS}`,
        { headers: { Authorization: `Bearer ${S.token}` }, cache: "no-store" });
      if (r.ok) {
        const doc = new DOMParser().parseFromString(await r.text(), "image/svg+xml");
        const svg = doc.documentElement;
        if (svg && svg.namespaceURI === "http://www.w3.org/2000/svg") {
          $("usage").replaceChildren(document.importNode(svg, true));
        }
      }
    } catch (e) {
      // the next refresh tries again
    } finally {
      S.usageTimer = null;
    }
  }

  function explainSoon() {
    if (S.explainTimer) return;
    const wait = Math.max(0, S.explainedAt + EXPLAIN_EVERY_MS - Date.now());
    S.explainTimer = setTimeout(explainQueue, wait);
  }

  async function explainQueue() {
    S.explainedAt = Date.now();
    const ids = S.snap ? S.snap.queued.slice(0, EXPLAIN_MAX).map((j) => j.id) : [];
    const got = await Promise.allSettled(ids.map((id) => api(`/v1/jobs/${id}/explain`)));
    const next = new Map();
    got.forEach((r, i) => { if (r.status === "fulfilled") next.set(ids[i], r.value); });
    S.explains = next;
    S.explainTimer = null;
    if (S.snap) { renderQueue(); renderMine(); }
  }

  function addEvents(events) {
    let added = false;
    for (const e of events) {
      if (e.id <= S.lastEventId) continue;
      S.events.push(e);
      S.lastEventId = e.id;
      added = true;
    }
    if (S.events.length > FEED_MAX) S.events.splice(0, S.events.length - FEED_MAX);
    if (added) renderFeed();
  }

  async function pollFeed() {
    try {
      const r = await api(`/v1/events?after=${S.lastEventId}&limit=${FEED_MAX}`);
      addEvents(r.events);
    } catch (e) { /* the state refresh reports the trouble */ }
  }

  function openStream() {
    if (S.es) S.es.close();
    S.streamOpenedAt = Date.now();
    const url = `/v1/events/stream?after=${S.lastEventId}&token=${encodeURIComponent(S.token)}`;
    const es = new EventSource(url);
    S.es = es;
    es.addEventListener("hello", () => { S.sseOpen = true; renderConn(); requestRefresh(); pollFeed(); });
    es.addEventListener("change", () => requestRefresh());
    es.addEventListener("feed", (ev) => {
      try { addEvents([JSON.parse(ev.data)]); } catch (e) { /* a malformed frame is skipped */ }
    });
    es.addEventListener("error", () => {
      S.sseOpen = false;
      if (es.readyState === EventSource.CLOSED && S.es === es) S.es = null;
      renderConn();
      refresh();
    });
  }

  function everySecond() {
    tick();
    const now = Date.now();
    const every = S.sseOpen ? SAFETY_POLL_MS : POLL_MS;
    if (now - S.lastAttempt >= every) {
      refresh();
      if (!S.sseOpen) pollFeed();
    }
    if (!S.es && now - S.streamOpenedAt >= STREAM_RETRY_MS) openStream();
    renderConn();
    if (S.snap) renderSummary();
  }

  // ---------------------------------------------------------------- detail drawer

  function closePanel() {
    if (S.panelAbort) S.panelAbort.abort();
    S.panelAbort = null;
    S.panel = null;
    S.back = null;
    $("drawer").hidden = true;
  }

  function openPanel(panel, fromPanel) {
    if (S.panelAbort) S.panelAbort.abort();
    S.panelAbort = new AbortController();
    S.back = fromPanel ? S.panel : null;
    S.panel = panel;
    $("drawer-back").hidden = !S.back;
    $("drawer").hidden = false;
    $("drawer-title").textContent = panel.type === "device" ? panel.id : `job ${panel.id}`;
    panel.info = h("div");
    panel.extra = h("div");
    $("drawer-body").replaceChildren(panel.info, panel.extra);
    panel.info.append(h("p", { class: "empty" }, "Loading…"));
    loadPanel(panel, true);
    $("drawer-close").focus();
  }

  function openDevice(id) { openPanel({ type: "device", id }, S.panel && S.panel.type === "job"); }

  function openJob(id) { openPanel({ type: "job", id: Number(id) }, S.panel && S.panel.type === "device"); }

  function refreshPanel() { if (S.panel) loadPanel(S.panel, false); }

  async function loadPanel(panel, first) {
    try {
      if (panel.type === "device") {
        const data = await api(`/v1/devices/${encodeURIComponent(panel.id)}/describe`);
        if (S.panel === panel) panel.info.replaceChildren(...devicePanel(data));
      } else {
        const view = await api(`/v1/jobs/${panel.id}`);
        const ex = view.job.state === "queued" ? await api(`/v1/jobs/${panel.id}/explain`).catch(() => null) : null;
        if (S.panel !== panel) return;
        panel.info.replaceChildren(...jobPanel(view, ex));
        if (first && view.job.kind === "job") startLog(panel, view.job);
      }
    } catch (e) {
      if (S.panel === panel) panel.info.replaceChildren(h("p", { class: "error" }, e.message));
    }
  }

  function kv(pairs) {
    return h("dl", { class: "kv" }, pairs.filter(Boolean).map(([k, v]) => [h("dt", null, k), h("dd", null, v)]));
  }

  function devicePanel(data) {
    const v = data.view;
    const d = v.device;
    const key = viewState(v);
    const out = [];
    const box = h("div", { class: `explain s-${key}` }, h("p", null, pill(key)));
    if (d.state === "unhealthy") {
      const q = QUARANTINE[d.quarantine_reason] || QUARANTINE[""];
      box.append(h("p", { class: "headline" }, q.headline));
      if (d.quarantine_detail) box.append(h("p", { class: "quote" }, `“${d.quarantine_detail}”`));
      box.append(h("p", null, q.why), h("p", null, q.advice));
    } else if (v.holder) {
      const max = v.max_runtime_seconds;
      box.append(h("p", { class: "headline" }, v.kind === "hold" ? `Held by ${v.holder}` : `Running job ${v.job_id} for ${v.holder}`, youBadge(v.holder)));
      box.append(ticking("p", "", () => {
        const el = v.elapsed_seconds + sinceFetch();
        if (!max) return `For ${dur(el)} so far; no time limit.`;
        const left = max - el;
        return left > 0 ? `For ${dur(el)} of at most ${dur(max)}: free by ${clock(Date.now() + left * 1000)} at the latest.`
          : `For ${dur(el)}, past its ${dur(max)} limit; the watchdog ends it.`;
      }));
      if (v.kind === "hold" && v.reason) box.append(h("p", null, `Reason: ${v.reason}`));
      if (d.state === "unknown") box.append(h("p", null, "Its worker is silent; the job keeps its lease until the worker returns or is written off."));
    } else if (key === "draining") {
      box.append(h("p", { class: "headline" }, "Draining: no new job starts here."), d.drain_reason ? h("p", null, `Reason: ${d.drain_reason}`) : null);
    } else if (d.state === "unknown") {
      box.append(h("p", { class: "headline" }, "Its worker is not reporting."),
        h("p", null, "Nothing is handed out here until the worker reports again; after a longer silence the device is taken out of the pool."));
    } else {
      box.append(h("p", { class: "headline" }, "Free: the next job that matches it starts here."));
    }
    out.push(box);
    out.push(kv([
      ["Host", d.host],
      ["Heartbeat", ago(data.view.heartbeat_age_seconds || 0)],
      ["Runtime ceiling", d.max_runtime_seconds ? dur(d.max_runtime_seconds) : "none"],
      v.job_id ? ["Job", ref(`job ${v.job_id}`, () => openJob(v.job_id))] : null,
      v.command && v.command.length && v.kind !== "hold" ? ["Command", h("span", { class: "mono" }, jobWhat(v))] : null,
      d.draining ? [STATES.draining.word, d.drain_reason || "yes"] : null,
    ]));
    if (S.me && S.me.role === "admin") out.push(adminActions(d));
    out.push(h("h3", null, "Labels"));
    if (data.labels.length) {
      out.push(h("table", { class: "labels" },
        h("thead", null, h("tr", null, h("th", null, "key"), h("th", null, "value"), h("th", null, "source"))),
        h("tbody", null, data.labels.map((l) => h("tr", null,
          h("td", null, l.key), h("td", null, l.value),
          h("td", null, h("span", { class: "src" }, `${l.source}, ${ago(data.label_age_seconds[`${l.key}/${l.source}`] || 0)}`)))))));
    } else {
      out.push(h("p", { class: "empty" }, "No labels."));
    }
    if (data.sheet) {
      out.push(h("h3", null, data.sheet_is_host_wide ? "Usage sheet (whole host)" : "Usage sheet"));
      out.push(h("pre", { class: "sheet" }, document.createTextNode(escapeControls(data.sheet))));
    }
    out.push(h("h3", null, "Recent jobs here"));
    out.push(data.recent_jobs.length ? h("div", null, data.recent_jobs.map(recentItem))
      : h("p", { class: "empty" }, "None yet."));
    return out;
  }

  function adminActions(d) {
    const box = h("div", { class: "actions" });
    if (d.state === "unhealthy") {
      box.append(h("button", { class: "action", type: "button", "data-action": "clear", onclick: () => confirmAction({
        title: `Return ${d.id} to the pool?`,
        text: `It was taken out because: ${d.quarantine_detail || d.quarantine_reason || "unknown cause"}. Return it only once you know nothing of the old job is left on it.`,
        ok: "Return to pool",
        run: () => api(`/v1/devices/${encodeURIComponent(d.id)}/clear`, { method: "POST", body: {} }),
      }) }, "Return to pool"));
    }
    if (d.draining) {
      box.append(h("button", { class: "action", type: "button", "data-action": "undrain", onclick: () => confirmAction({
        title: `Undrain ${d.id}?`, text: "New jobs may start on it again.", ok: "Undrain",
        run: () => api(`/v1/devices/${encodeURIComponent(d.id)}/undrain`, { method: "POST", body: {} }),
      }) }, "Undrain"));
    } else {
      box.append(h("button", { class: "action", type: "button", "data-action": "drain", onclick: () => confirmAction({
        title: `Drain ${d.id}?`, text: "The job on it (if any) finishes; no new job starts on it until it is undrained.", ok: "Drain",
        run: () => api(`/v1/devices/${encodeURIComponent(d.id)}/drain`, { method: "POST", body: {} }),
      }) }, "Drain"));
    }
    box.append(h("button", { class: "action warn", type: "button", "data-action": "retire", onclick: () => confirmAction({
      title: `Retire ${d.id}?`,
      text: "It leaves the fleet with its labels and sheet; job history stays. A worker that still declares it brings it back at its next registration.",
      ok: "Retire",
      run: () => api(`/v1/devices/${encodeURIComponent(d.id)}`, { method: "DELETE" }),
      after: closePanel,
    }) }, "Retire"));
    return box;
  }

  function endWords(j) {
    const why = endReason(j);
    return !why ? "" : why.startsWith("by ") ? ` ${why}` : `: ${why}`;
  }

  function jobHeadline(j, pos) {
    switch (j.state) {
      case "queued": return `Waiting${pos ? `, ${ordinal(pos)} in line` : ""} for ${j.selector ? ((j.count || 1) > 1 ? `${j.count} devices of one host matching ${j.selector}` : `a device matching ${j.selector}`) : devs(j)}.`;
      case "assigned": return `Starting on ${devs(j)}.`;
      case "running": return `Running on ${devs(j)}.`;
      case "succeeded": return `Succeeded on ${devs(j)}.`;
      case "failed": return `Failed on ${devs(j)}${j.exit_code !== null && j.exit_code !== undefined ? ` with exit code ${j.exit_code}` : ""}.`;
      case "killed": return `Killed${endWords(j)}.`;
      case "lost": return `Lost${endWords(j)}. Nothing proves it ended; its device was quarantined.`;
      default: return j.state;
    }
  }

  function jobPanel(view, ex) {
    const j = view.job;
    const out = [];
    const box = h("div", { class: `explain s-${JOB_TONE[j.state]}` },
      h("p", { class: "headline" }, jobHeadline(j, view.queue_position)));
    const v = allDevices().find((x) => x.job_id === j.id);
    if (v && v.elapsed_seconds !== null && v.elapsed_seconds !== undefined) {
      box.append(ticking("p", "", () => {
        const el = v.elapsed_seconds + sinceFetch();
        const max = v.max_runtime_seconds;
        return max ? `For ${dur(el)} of at most ${dur(max)}: ends by ${clock(Date.now() + (max - el) * 1000)} at the latest.`
          : `For ${dur(el)} so far; no time limit.`;
      }));
    }
    if (ex) for (const r of ex.reasons) box.append(h("p", null, r));
    out.push(box);
    const waited = j.started_at ? j.started_at - j.submitted_at : null;
    out.push(kv([
      ["Submitter", h("span", null, j.submitter, asUser(j), youJob(j))],
      ["Kind", j.kind === "hold" ? `hold${j.reason ? `: ${j.reason}` : ""}` : (j.stdio ? `job (${j.stdio})` : "job")],
      j.device_id ? [(j.device_ids || []).length > 1 ? "Devices" : "Device",
        h("span", null, ...((j.device_ids && j.device_ids.length) ? j.device_ids : [j.device_id])
          .flatMap((d, i) => [i ? " " : null, ref(d, () => openDevice(d))]))] : null,
      j.selector ? ["Selector", h("span", { class: "mono" }, j.selector)] : null,
      ["Priority", String(j.priority)],
      ["Submitted", when(j.submitted_at)],
      waited !== null ? ["Waited", dur(waited)] : null,
      j.started_at ? ["Started", when(j.started_at)] : null,
      j.finished_at ? ["Finished", when(j.finished_at)] : null,
      j.started_at && j.finished_at ? ["Ran", dur(j.finished_at - j.started_at)] : null,
      ["Max runtime", j.max_runtime_seconds ? dur(j.max_runtime_seconds) : "none"],
      j.idle_timeout_seconds ? ["Idle timeout", dur(j.idle_timeout_seconds)] : null,
      j.exit_code !== null && j.exit_code !== undefined ? ["Exit code", String(j.exit_code)] : null,
      j.kill_reason ? ["Why it ended", j.kill_reason] : null,
      j.reason && j.kind !== "hold" ? ["Reason", j.reason] : null,
      j.cwd ? ["Directory", h("span", { class: "mono" }, j.cwd)] : null,
    ]));
    if (j.kind === "job") out.push(h("h3", null, "Command"), h("pre", { class: "cmdline" }, commandText(j.command)));
    const mayKill = S.me && (S.me.role === "admin" || ownsJob(j));
    if (mayKill && !TERMINAL.has(j.state)) {
      const verb = j.state === "queued" ? "Cancel" : (j.kind === "hold" ? "Release" : "Kill");
      out.push(h("div", { class: "actions" }, h("button", { class: "action warn", type: "button", "data-action": "kill", onclick: () => confirmAction({
        title: `${verb} job ${j.id}?`,
        text: j.state === "queued" ? "It leaves the queue and never runs."
          : `Its processes on ${devs(j)} are stopped (SIGTERM, then SIGKILL) and the device is checked before it is handed out again.`,
        ok: verb,
        run: () => api(`/v1/jobs/${j.id}/kill`, { method: "POST", body: {} }),
      }) }, `${verb} job`)));
    }
    return out;
  }

  function startLog(panel, job) {
    if (job.stdio === "tty") {
      panel.extra.replaceChildren(h("h3", null, "Output"), h("p", { class: "empty" }, "A terminal session: its output is not stored."));
      return;
    }
    const pre = h("pre", { class: "log", "aria-label": `output of job ${job.id}` });
    const status = h("div", { class: "log-status" }, "connecting…");
    panel.extra.replaceChildren(h("h3", null, job.stdio === "pipe" ? "Stored output (stderr)" : "Output"), pre, status);
    followLog(job.id, pre, status, S.panelAbort.signal);
  }

  async function followLog(jobId, pre, status, signal) {
    const decoder = new TextDecoder();
    let text = "";
    let offset = 0;
    for (;;) {
      try {
        const r = await fetch(`/v1/jobs/${jobId}/logs?follow=1&offset=${offset}`, {
          headers: { Authorization: `Bearer ${S.token}` }, signal, cache: "no-store",
        });
        if (!r.ok) {
          let msg = `HTTP ${r.status}`;
          try { msg = (await r.json()).message || msg; } catch (e) { /* not JSON */ }
          status.textContent = msg;
          return;
        }
        status.textContent = offset ? "following the output live…" : "following the output live; nothing written yet";
        const reader = r.body.getReader();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          offset += value.length;
          text += decoder.decode(value, { stream: true });
          if (text.length > LOG_KEEP) text = text.slice(-LOG_KEEP);
          const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
          pre.textContent = stripAnsi(text);
          if (atBottom) pre.scrollTop = pre.scrollHeight;
        }
        status.textContent = offset ? `end of output (${bytes(offset)})` : "no output";
        return;
      } catch (e) {
        if (signal.aborted) return;
        status.textContent = `output stream broke (${e.message}); resuming…`;
        await new Promise((resolve) => setTimeout(resolve, LOG_RETRY_MS));
        if (signal.aborted) return;
      }
    }
  }

  // ---------------------------------------------------------------- confirmation and toasts

  let pending = null;

  function confirmAction(action) {
    pending = action;
    $("confirm-title").textContent = action.title;
    $("confirm-text").textContent = visible(action.text);
    $("confirm-error").textContent = "";
    $("confirm-ok").textContent = action.ok;
    $("confirm-ok").disabled = false;
    $("confirm").hidden = false;
    $("confirm-cancel").focus();
  }

  function closeConfirm() { pending = null; $("confirm").hidden = true; }

  async function runConfirmed() {
    if (!pending) return;
    const action = pending;
    $("confirm-ok").disabled = true;
    try {
      const r = await action.run();
      closeConfirm();
      toast((r && r.message) || `${action.ok}: done`);
      if (action.after) action.after();
      refresh();
    } catch (e) {
      $("confirm-error").textContent = visible(e.message);  // the controller's words
      $("confirm-ok").disabled = false;
    }
  }

  function toast(text, bad) {
    const t = h("div", { class: bad ? "toast bad" : "toast", role: "status" }, text);
    $("toasts").append(t);
    setTimeout(() => t.remove(), 5000);
  }

  // ---------------------------------------------------------------- sign in and out

  function showLogin(message) {
    $("app").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message || "";
    $("token-input").value = "";
    $("token-input").focus();
  }

  // Forget the token and start over (a reload drops every timer, stream and panel).
  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    if (message) sessionStorage.setItem("rc_login_message", message);
    if (S.es) S.es.close();
    for (const t of S.timers) clearInterval(t);
    window.location.reload();
  }

  async function enter(token) {
    S.token = token;
    let me;
    try {
      me = await api("/v1/whoami");
    } catch (e) {
      if (e.status === 401 || e.status === 403) {
        sessionStorage.removeItem(TOKEN_KEY);
        showLogin(`The controller refused that token: ${e.message}`);
      } else {
        showLogin(`Cannot reach the controller: ${e.message}`);
      }
      return;
    }
    if (me.role === "worker") {
      showLogin("That is a worker token; the dashboard needs a user or admin token.");
      return;
    }
    S.me = me;
    sessionStorage.setItem(TOKEN_KEY, token);
    $("login").hidden = true;
    $("who").replaceChildren("signed in as ", h("b", null, me.name), me.role === "admin" ? " (admin)" : "");
    $("signout").hidden = false;
    try {
      const r = await api(`/v1/events?limit=${FEED_SEED}`);
      addEvents(r.events);
    } catch (e) { /* the refresh below reports it */ }
    renderFeed();
    await refresh();
    openStream();
    S.timers.push(setInterval(everySecond, 1000));
  }

  function wire() {
    $("login-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const t = $("token-input").value.trim();
      if (t) enter(t);
    });
    $("signout").addEventListener("click", () => signOut(""));
    // a link from rc dashboard opened in this tab changes only the fragment: the
    // page loads again, and takes the code as it loads (takeCode)
    window.addEventListener("hashchange", () => {
      if (new URLSearchParams(location.hash.slice(1)).has("code")) window.location.reload();
    });
    $("drawer-close").addEventListener("click", closePanel);
    $("drawer-back").addEventListener("click", () => {
      const back = S.back;
      if (back) openPanel({ type: back.type, id: back.id }, false);
    });
    $("confirm-cancel").addEventListener("click", closeConfirm);
    $("confirm-ok").addEventListener("click", runConfirmed);
    document.addEventListener("keydown", (ev) => {
      if (ev.key !== "Escape") return;
      if (!$("confirm").hidden) closeConfirm();
      else if (!$("drawer").hidden) closePanel();
    });
  }

  // A one-time code from `rc dashboard` (#code=... or ?code=...), taken out of the
  // address bar at once (history.replaceState) so that neither the history nor a
  // reload nor a copied address keeps it; "" when the address carries none.
  function takeCode() {
    const fragment = new URLSearchParams(location.hash.slice(1));
    const query = new URLSearchParams(location.search);
    const code = fragment.get("code") || query.get("code") || "";
    if (fragment.has("code") || query.has("code")) {
      query.delete("code");
      const rest = query.toString();
      history.replaceState(null, "", location.pathname + (rest ? `?${rest}` : ""));
    }
    return code;
  }

  // Spend the code for a session acting as whoever ran `rc dashboard`; the session
  // token is then kept as a pasted one is (sessionStorage).
  async function signInWithCode(code) {
    S.token = "";
    let got;
    try {
      got = await api("/v1/dashboard/session", { method: "POST", body: { code } });
    } catch (e) {
      showLogin(e.status === 401 || e.status === 400
        ? `That sign-in link did not work: ${e.message}`
        : `Cannot reach the controller: ${e.message}`);
      return;
    }
    await enter(got.token);
  }

  wire();
  const code = takeCode();
  const saved = sessionStorage.getItem(TOKEN_KEY);
  const note = sessionStorage.getItem("rc_login_message");
  sessionStorage.removeItem("rc_login_message");
  if (code) signInWithCode(code);
  else if (saved) enter(saved);
  else showLogin(note || "");
})();
