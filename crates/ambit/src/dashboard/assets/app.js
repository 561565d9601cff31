// ambit dashboard: polling, header, selection.  Loaded first; graph.js and
// panel.js add Ambit.graph and Ambit.panel; start() runs on DOMContentLoaded.
// Everything from the API is untrusted text: it only ever goes into
// textContent or attribute values, never into innerHTML.
'use strict';

window.Ambit = (function () {
  const SVG_NS = 'http://www.w3.org/2000/svg';

  // --- small DOM helpers ---------------------------------------------------
  // h('td', {class: 'num', title: 'x'}, 'text', child, ...) -> HTMLElement
  function h(tag, props, ...children) {
    const el = document.createElement(tag);
    setProps(el, props);
    append(el, children);
    return el;
  }
  function s(tag, props, ...children) {
    const el = document.createElementNS(SVG_NS, tag);
    setProps(el, props);
    append(el, children);
    return el;
  }
  function setProps(el, props) {
    if (!props) return;
    for (const [k, v] of Object.entries(props)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'onclick') el.addEventListener('click', v);
      else if (k === 'text') el.textContent = String(v);
      else el.setAttribute(k, String(v));
    }
  }
  function append(el, children) {
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      el.appendChild(typeof c === 'object' ? c : document.createTextNode(String(c)));
    }
  }
  function clear(el) { while (el.firstChild) el.removeChild(el.firstChild); }

  // --- formatting ------------------------------------------------------------
  function num(n) {
    if (!Number.isFinite(n)) return '0';
    if (n === 0) return '0';
    const a = Math.abs(n);
    if (a >= 1e9) return (n / 1e9).toFixed(a >= 1e10 ? 0 : 1) + 'G';
    if (a >= 1e6) return (n / 1e6).toFixed(a >= 1e7 ? 0 : 1) + 'M';
    if (a >= 1e4) return (n / 1e3).toFixed(0) + 'k';
    if (a >= 100) return n.toFixed(0);
    if (a >= 10) return n.toFixed(1).replace(/\.0$/, '');
    if (a >= 0.1) return n.toFixed(2).replace(/\.?0+$/, '');
    if (a >= 0.01) return n.toFixed(2);
    return '<0.01';
  }
  function bytes(n) {
    if (!Number.isFinite(n) || n <= 0) return '0 B';
    const units = ['B', 'kB', 'MB', 'GB', 'TB'];
    let i = 0;
    while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
    return (i === 0 ? n.toFixed(n < 10 ? 1 : 0).replace(/\.0$/, '') : n.toFixed(n < 10 ? 1 : 0)) + ' ' + units[i];
  }
  function plural(n, word, many) { return n + ' ' + (n === 1 ? word : (many || word + 's')); }
  function pad(n) { return String(n).padStart(2, '0'); }
  function clock(d) { return pad(d.getHours()) + ':' + pad(d.getMinutes()) + ':' + pad(d.getSeconds()); }
  function parseTime(t) { const d = new Date(t); return Number.isNaN(d.getTime()) ? null : d; }
  // "in 23 h 58 min" / "3 min ago"
  function relative(ms) {
    const past = ms < 0;
    let m = Math.round(Math.abs(ms) / 60000);
    let text;
    if (m < 1) text = 'less than a minute';
    else if (m < 60) text = m + ' min';
    else if (m < 48 * 60) text = Math.floor(m / 60) + ' h' + (m % 60 ? ' ' + (m % 60) + ' min' : '');
    else text = Math.round(m / 1440) + ' days';
    return past ? text + ' ago' : 'in ' + text;
  }

  const Ambit = {
    h, s, clear, fmt: { num, bytes, plural, clock, parseTime, relative },
    state: {
      graph: null,          // last /api/graph answer
      nodesById: new Map(),
      edgesById: new Map(),
      selected: null,       // {type: 'node'|'edge', id}
      refreshes: 0,
      etag: null,
    },
  };

  // --- selection -------------------------------------------------------------
  Ambit.select = function (type, id) {
    Ambit.state.selected = id ? { type, id } : null;
    Ambit.graph.markSelected(Ambit.state.selected);
    if (id) Ambit.panel.open(type, id);
    else Ambit.panel.close();
  };
  Ambit.deselect = function () {
    Ambit.state.selected = null;
    Ambit.graph.markSelected(null);
    Ambit.panel.close();
  };

  // --- header ----------------------------------------------------------------
  function showHeader(g, error) {
    const src = document.getElementById('source');
    if (g) src.textContent = g.source ? 'source: ' + g.source : '';
    const upd = document.getElementById('updated');
    const now = new Date();
    if (error) {
      upd.classList.add('stale');
      upd.textContent = (Ambit.state.lastOk ? 'last updated ' + clock(Ambit.state.lastOk) + ' · ' : '') +
        'refresh failed ' + clock(now);
    } else {
      upd.classList.remove('stale');
      Ambit.state.lastOk = now;
      upd.textContent = 'updated ' + clock(now);
      const gen = g && parseTime(g.generated);
      upd.title = gen ? 'data collected by the server at ' + gen.toISOString() : '';
    }
    const list = document.getElementById('problems');
    clear(list);
    const problems = (g && Array.isArray(g.problems) ? g.problems.slice() : []);
    if (error) problems.unshift('cannot refresh the graph: ' + error);
    for (const p of problems) list.appendChild(h('li', { text: p }));
    list.hidden = problems.length === 0;
  }

  // --- polling ----------------------------------------------------------------
  let timer = null;
  let failures = 0;

  async function refresh() {
    const st = Ambit.state;
    const headers = { Accept: 'application/json' };
    if (st.etag && st.graph) headers['If-None-Match'] = st.etag;
    let g = null;
    try {
      const resp = await fetch('/api/graph', { headers, cache: 'no-store' });
      if (resp.status === 304 && st.graph) {
        g = st.graph;
      } else if (!resp.ok) {
        let msg = 'HTTP ' + resp.status;
        try { const body = await resp.json(); if (body && body.error) msg = String(body.error); } catch (_) { /* not JSON */ }
        throw new Error(msg);
      } else {
        g = await resp.json();
        st.etag = resp.headers.get('ETag');
        apply(g);
      }
      failures = 0;
      st.refreshes++;
      document.body.dataset.refreshes = String(st.refreshes);
      showHeader(g, null);
    } catch (e) {
      failures++;
      showHeader(st.graph, e && e.message ? e.message : String(e));
    }
    const interval = Math.max(0.5, Number(st.graph && st.graph.interval) || 2);
    // back off while the server does not answer, up to 30 s
    const wait = failures ? Math.min(30, interval * Math.pow(2, failures - 1)) : interval;
    timer = setTimeout(refresh, wait * 1000);
  }

  function apply(g) {
    const st = Ambit.state;
    g.nodes = Array.isArray(g.nodes) ? g.nodes : [];
    g.edges = Array.isArray(g.edges) ? g.edges : [];
    g.namespaces = Array.isArray(g.namespaces) ? g.namespaces : [];
    const first = !st.graph;
    const prevNodes = st.nodesById, prevEdges = st.edgesById;
    st.graph = g;
    st.nodesById = new Map(g.nodes.map((n) => [n.id, n]));
    st.edgesById = new Map(g.edges.map((e) => [e.id, e]));
    Ambit.graph.render(g, first);
    document.getElementById('empty').hidden = g.nodes.length > 0;
    if (first) {
      const svg = document.getElementById('graph');
      svg.setAttribute('data-rendered', '1');
      window.ambitFirstRenderMs = Math.round(performance.now());
    }
    // keep the selection and the open panel; reload the panel only when the
    // selected item's numbers changed.
    const sel = st.selected;
    if (sel) {
      Ambit.graph.markSelected(sel);
      const before = (sel.type === 'node' ? prevNodes : prevEdges).get(sel.id);
      const after = (sel.type === 'node' ? st.nodesById : st.edgesById).get(sel.id);
      if (JSON.stringify(before) !== JSON.stringify(after)) Ambit.panel.reload();
    }
  }

  function start() {
    // the resource timing buffer fills after 250 polls; keep it fresh
    performance.addEventListener('resourcetimingbufferfull', () => performance.clearResourceTimings());
    document.getElementById('details-close').addEventListener('click', () => Ambit.deselect());
    document.addEventListener('keydown', (ev) => {
      if (ev.key === 'Escape' && Ambit.state.selected) Ambit.deselect();
    });
    Ambit.graph.init(document.getElementById('graph'));
    Ambit.panel.init(document.getElementById('details'));
    document.body.dataset.refreshes = '0';
    refresh();
  }

  document.addEventListener('DOMContentLoaded', start);
  Ambit.refreshNow = function () { clearTimeout(timer); return refresh(); };
  return Ambit;
})();
