// ambit dashboard: the graph.  A deterministic layered layout (no physics):
// rank = longest path from the sources over the edges (cycles broken by a
// DFS in id order); each namespace is a horizontal band; a node sits in its
// rank's column inside its band, nodes sharing a column are stacked in name
// order.  Drawn as plain SVG; pan by dragging, zoom with the wheel.
'use strict';

(function (Ambit) {
  const { s, clear, fmt } = Ambit;
  const NODE_W = 184, NODE_H = 60, COL_GAP = 150, ROW_GAP = 18;
  const BAND_HEAD = 34, BAND_PAD = 16, BAND_GAP = 18, MARGIN = 24, GRID_GAP = 40;

  let svg = null, layers = null;
  let view = null;           // current viewBox {x, y, w, h}
  let bounds = null;         // content bounds of the last layout
  let userMoved = false;     // the user panned or zoomed: don't refit on updates
  let lastSig = null, lastGraph = null;

  // --- layout ------------------------------------------------------------------
  function ranks(nodes, edges) {
    const ids = nodes.map((n) => n.id).sort();
    const out = new Map(ids.map((id) => [id, []]));
    const indeg = new Map(ids.map((id) => [id, 0]));
    for (const e of edges) {
      if (!out.has(e.source) || !out.has(e.target) || e.source === e.target) continue;
      out.get(e.source).push(e.target);
      indeg.set(e.target, indeg.get(e.target) + 1);
    }
    for (const l of out.values()) l.sort();
    // DFS (iterative) from the sources first, then from anything left, to
    // find back edges; dropping them leaves a DAG.
    const state = new Map();   // 1 = on stack, 2 = done
    const back = new Set();
    const starts = ids.filter((id) => indeg.get(id) === 0).concat(ids);
    for (const root of starts) {
      if (state.has(root)) continue;
      const stack = [[root, 0]];
      state.set(root, 1);
      while (stack.length) {
        const top = stack[stack.length - 1];
        const succ = out.get(top[0]);
        if (top[1] < succ.length) {
          const t = succ[top[1]++];
          const st = state.get(t);
          if (st === 1) back.add(top[0] + '\u0000' + t);
          else if (!st) { state.set(t, 1); stack.push([t, 0]); }
        } else {
          state.set(top[0], 2);
          stack.pop();
        }
      }
    }
    // longest path over the DAG, in topological order (Kahn)
    const deg = new Map(ids.map((id) => [id, 0]));
    for (const [src, l] of out) for (const t of l) if (!back.has(src + '\u0000' + t)) deg.set(t, deg.get(t) + 1);
    const rank = new Map(ids.map((id) => [id, 0]));
    const queue = ids.filter((id) => deg.get(id) === 0);
    for (let i = 0; i < queue.length; i++) {
      const u = queue[i];
      for (const t of out.get(u)) {
        if (back.has(u + '\u0000' + t)) continue;
        rank.set(t, Math.max(rank.get(t), rank.get(u) + 1));
        deg.set(t, deg.get(t) - 1);
        if (deg.get(t) === 0) queue.push(t);
      }
    }
    return rank;
  }

  // One namespace box per namespace, namespaces in name order and the outside
  // world last.  The boxes are packed into columns (contiguous runs of that
  // order, each column a stack of boxes as wide as its widest).  Inside a
  // column its boxes share the rank columns they use, so one column is the
  // classic full-width band layout.  Ranks are either global (over all edges)
  // or per namespace (over the edges inside it, so each box is only as wide as
  // its own longest path).  Of those and 1..N columns, the arrangement whose
  // fit to the window has the largest scale wins.
  let prevPick = '';         // the last arrangement: kept while nearly as good
  function bandLabel(name, info) {
    const ambient = info && info.ambient;
    return {
      name: name === '' ? 'outside the mesh' : name,
      tag: name === '' ? 'addresses that are no known workload' : ambient ? '● ambient mesh' : 'not in the ambient mesh',
    };
  }
  function makeBands(order, members, nsInfo, rank) {
    return order.map((name) => {
      const cols = new Map();
      for (const n of members.get(name)) {
        const r = rank.get(n.id) || 0;
        if (!cols.has(r)) cols.set(r, []);
        cols.get(r).push(n);
      }
      let rows = 0;
      for (const c of cols.values()) {
        c.sort((a, b) => a.name.localeCompare(b.name) || a.kind.localeCompare(b.kind) || a.id.localeCompare(b.id));
        rows = Math.max(rows, c.length);
      }
      const inner = rows ? rows * NODE_H + (rows - 1) * ROW_GAP : 20;
      const lab = bandLabel(name, nsInfo.get(name));
      const minW = 16 + width(lab.name, '700 15px') + 12 + width(lab.tag, '600 11px') + 16;
      return { name, info: nsInfo.get(name), cols, inner, h: BAND_HEAD + inner + BAND_PAD, minW, empty: !members.get(name).length };
    });
  }
  // the rank columns a run of boxes shares, and the width that takes
  function runCols(bands, i, j) {
    return [...new Set(bands.slice(i, j).flatMap((b) => [...b.cols.keys()]))].sort((a, b) => a - b);
  }
  function runW(bands, i, j) {
    const k = runCols(bands, i, j).length;
    return Math.max(k ? k * NODE_W + (k - 1) * COL_GAP + 2 * MARGIN : 0, ...bands.slice(i, j).map((b) => b.minW));
  }
  // c columns: split the order into c runs with the lowest tallest run (DP);
  // its scale when fitted into vw × vh
  function split(bands, c, vw, vh) {
    const N = bands.length, pre = [0];
    for (const b of bands) pre.push(pre[pre.length - 1] + b.h + BAND_GAP);
    const runH = (i, j) => pre[j] - pre[i] - BAND_GAP;
    let best = pre.map((_, j) => (j === 0 ? { h: 0, cut: [] } : null));
    for (let k = 1; k <= c; k++) {
      const row = pre.map(() => null);
      for (let j = k; j <= N; j++) {
        for (let i = k - 1; i < j; i++) {
          if (!best[i]) continue;
          const h = Math.max(best[i].h, runH(i, j));
          if (!row[j] || h <= row[j].h) row[j] = { h, cut: best[i].cut.concat([i]) };   // ties: fuller first columns
        }
      }
      best = row;
    }
    const r = best[N];
    const runs = r.cut.map((i, k) => [i, k + 1 < r.cut.length ? r.cut[k + 1] : N]);
    const w = runs.reduce((sum, [i, j]) => sum + runW(bands, i, j), 0) + (runs.length - 1) * GRID_GAP;
    const scale = Math.min(1.4, vw / Math.max(400, w + MARGIN), vh / Math.max(200, r.h + MARGIN));
    return { runs, scale };
  }
  function layout(g, vw, vh) {
    const nsInfo = new Map(g.namespaces.map((n) => [n.name, n]));
    const members = new Map(), bandKey = new Map();
    for (const ns of g.namespaces) members.set(ns.name, []);
    for (const n of g.nodes) {
      const key = n.kind === 'external' ? '' : (n.namespace || '');
      if (!members.has(key)) members.set(key, []);
      members.get(key).push(n);
      bandKey.set(n.id, key);
    }
    // namespaces in name order; the outside world last
    const order = [...members.keys()].sort((a, b) => (a === '') - (b === '') || a.localeCompare(b));
    const N = order.length;
    if (!N) return { pos: new Map(), bandOf: bandKey, boxes: [], width: 0, height: 0, arrangement: '' };
    const inside = g.edges.filter((e) => bandKey.has(e.source) && bandKey.get(e.source) === bandKey.get(e.target));
    const tried = new Map();
    let pick = null;
    for (const [scheme, edges] of [['global', g.edges], ['local', inside]]) {
      const bands = makeBands(order, members, nsInfo, ranks(g.nodes, edges));
      for (let c = 1; c <= N; c++) {
        const a = { key: scheme + ' ' + c, bands, ...split(bands, c, vw, vh) };
        tried.set(a.key, a);
        if (!pick || a.scale > pick.scale * 1.02) pick = a;   // only for a clear gain
      }
    }
    // no jumping back and forth between arrangements of nearly the same scale
    const prev = tried.get(prevPick);
    if (prev && prev.scale >= pick.scale * 0.92) pick = prev;
    prevPick = pick.key;

    const pos = new Map(), boxes = [];
    let x = 0, height = 0;
    for (const [i, j] of pick.runs) {
      const w = runW(pick.bands, i, j);
      const colX = new Map(runCols(pick.bands, i, j).map((r, k) => [r, x + MARGIN + k * (NODE_W + COL_GAP)]));
      let y = 0;
      for (const b of pick.bands.slice(i, j)) {
        for (const [r, c] of b.cols) {
          const used = c.length * NODE_H + (c.length - 1) * ROW_GAP;
          const top = y + BAND_HEAD + (b.inner - used) / 2;
          c.forEach((n, k) => pos.set(n.id, { x: colX.get(r), y: top + k * (NODE_H + ROW_GAP) }));
        }
        boxes.push({ name: b.name, info: b.info, x, y, w, h: b.h, empty: b.empty });
        y += b.h + BAND_GAP;
      }
      height = Math.max(height, y - BAND_GAP);
      x += w + GRID_GAP;
    }
    return { pos, bandOf: bandKey, boxes, width: Math.max(0, x - GRID_GAP), height, arrangement: pick.key };
  }

  // --- drawing helpers ---------------------------------------------------------
  // cut text to max px, measured on a canvas in the page's font (no layout)
  let ctx = null, family = 'sans-serif';
  function width(text, font) {
    if (!ctx) {
      ctx = document.createElement('canvas').getContext('2d');
      family = getComputedStyle(document.documentElement).fontFamily || family;
    }
    ctx.font = font + ' ' + family;
    return ctx.measureText(text).width;
  }
  function fit(text, max, font) {
    text = String(text == null ? '' : text);
    if (width(text, font) <= max) return text;
    let lo = 0, hi = text.length;
    while (lo < hi) { const m = (lo + hi + 1) >> 1; if (width(text.slice(0, m) + '…', font) <= max) lo = m; else hi = m - 1; }
    return text.slice(0, Math.max(1, lo)) + '…';
  }
  function title(text) { return s('title', { text }); }

  function edgeRate(e) {
    return e.requests > 0 ? (e.requestsPerSecond || 0) : (e.connectionsPerSecond || 0);
  }
  function strokeWidth(e) {
    const w = 1.4 + 1.5 * Math.log10(1 + 10 * edgeRate(e));
    return Math.min(7, Math.max(1.4, w));
  }
  function edgeText(e) {
    const rate = edgeRate(e);
    const unit = e.requests > 0 ? 'req/s' : 'conn/s';
    // Bytes are the node proxies' (TCP) count; a waypoint's request edge has none of its own.
    const bytes = (b) => (e.requests > 0 && !e.bytes ? '' : ' · ' + b);
    // Denied attempts only: nothing went through.
    if (!e.connections && !e.requests && !e.bytes && e.denied > 0) return 'none allowed';
    let t;
    if (rate > 0 || e.bytesPerSecond > 0) t = fmt.num(rate) + ' ' + unit + bytes(fmt.bytes(e.bytesPerSecond) + '/s');
    else t = (e.requests > 0 ? fmt.plural(e.requests, 'req') : fmt.plural(e.connections || 0, 'conn')) + bytes(fmt.bytes(e.bytes));
    if (e.requests > 0 && e.errors > 0) t += ' · ' + fmt.plural(e.errors, 'err');
    return t;
  }
  function edgeTitle(e, g) {
    const name = (id) => { const n = Ambit.state.nodesById.get(id); return n ? (n.namespace ? n.namespace + '/' : '') + n.name : id; };
    const lines = [name(e.source) + ' → ' + name(e.target),
      'connections: ' + (e.connections || 0) + ' (' + fmt.num(e.connectionsPerSecond || 0) + '/s)',
      'bytes: ' + (e.bytes || 0) + ' (' + fmt.bytes(e.bytesPerSecond || 0) + '/s)'];
    if (e.requests > 0) lines.push('HTTP requests: ' + e.requests + ' (' + fmt.num(e.requestsPerSecond || 0) + '/s), ' + fmt.plural(e.errors || 0, 'error'));
    lines.push('mTLS: ' + ({ all: 'every connection', some: 'some connections', none: 'none (plaintext)' }[e.mtls] || e.mtls));
    if (e.denied > 0) lines.push('denied by policy: ' + e.denied);
    if (e.identities && e.identities.length) lines.push('identities:', ...e.identities.map((i) => '  ' + i));
    return lines.join('\n');
  }
  function nodeTitle(n) {
    const lines = [n.kind + ' ' + (n.namespace ? n.namespace + '/' : '') + n.name];
    if (n.kind !== 'external') lines.push(fmt.plural(n.pods || 0, 'pod'));
    if (n.identity) lines.push('identity: ' + n.identity);
    if (n.waypoint) lines.push('via waypoint ' + n.waypoint);
    if (n.kind !== 'external') lines.push(n.enrolled ? 'enrolled in the mesh' : 'not enrolled in the mesh');
    lines.push(fmt.plural(n.policies || 0, 'policy', 'policies') + ' apply', 'denied into it: ' + (n.denied || 0));
    return lines.join('\n');
  }

  // cubic Bézier between two points, horizontal tangents; da / db: the
  // side of the node each end sits on (+1 right, -1 left)
  function curve(a, b, da = 1, db = -1) {
    if (da === db) {   // both on the same side: a C-shaped arc
      const k = Math.max(60, Math.min(220, Math.abs(b.y - a.y) * 0.3));
      return [a, { x: a.x + da * (k + Math.max(0, da * (b.x - a.x))), y: a.y }, { x: b.x + db * (k + Math.max(0, db * (a.x - b.x))), y: b.y }, b];
    }
    const dx = (b.x - a.x) * da;
    const k = dx > 40 ? dx * 0.5 : Math.max(70, Math.abs(b.y - a.y) * 0.35);
    return [a, { x: a.x + da * k, y: a.y }, { x: b.x + db * k, y: b.y }, b];
  }
  // the sides of its nodes an edge leaves and enters: out of the right side,
  // into the left one; between namespaces the nearer sides
  function sides(e, L) {
    const ps = L.pos.get(e.source), pt = L.pos.get(e.target);
    if (e.source === e.target || L.bandOf.get(e.source) === L.bandOf.get(e.target)) return [1, -1];
    if (pt.x >= ps.x + NODE_W + 20) return [1, -1];
    if (pt.x + NODE_W + 20 <= ps.x) return [-1, 1];
    return [1, 1];
  }
  function at(c, t) {
    const u = 1 - t;
    return {
      x: u * u * u * c[0].x + 3 * u * u * t * c[1].x + 3 * u * t * t * c[2].x + t * t * t * c[3].x,
      y: u * u * u * c[0].y + 3 * u * u * t * c[1].y + 3 * u * t * t * c[2].y + t * t * t * c[3].y,
    };
  }
  // t where a left-to-right curve reaches x (the curve is monotonic in x)
  function tForX(c, x) {
    let lo = 0, hi = 1;
    for (let i = 0; i < 24; i++) { const m = (lo + hi) / 2; if (at(c, m).x < x) lo = m; else hi = m; }
    return (lo + hi) / 2;
  }
  function pathD(c) {
    const f = (p) => p.x.toFixed(1) + ' ' + p.y.toFixed(1);
    return 'M' + f(c[0]) + 'C' + f(c[1]) + ',' + f(c[2]) + ',' + f(c[3]);
  }
  function overlap(a, b) {
    return Math.max(0, Math.min(a.x + a.w, b.x + b.w) - Math.max(a.x, b.x)) *
      Math.max(0, Math.min(a.y + a.h, b.y + b.h) - Math.max(a.y, b.y));
  }

  // --- render ------------------------------------------------------------------
  function render(g, first) {
    const sig = JSON.stringify([g.namespaces, g.nodes, g.edges]);
    if (sig === lastSig) return;
    lastSig = sig;
    lastGraph = g;
    const r = svg.getBoundingClientRect();
    const L = layout(g, r.width > 0 ? r.width : 1600, r.height > 0 ? r.height : 800);
    svg.setAttribute('data-arrangement', L.arrangement);
    for (const l of Object.values(layers)) clear(l);

    for (const b of L.boxes) drawBand(b);

    // spread the ends of the edges along the sides of each node, in the
    // vertical order of the other ends, so arrows into one node don't pile up
    // (per side of a node: edges between namespaces may use either side)
    const ends = new Map();
    const valid = g.edges.filter((e) => L.pos.has(e.source) && L.pos.has(e.target));
    const mid = (id) => L.pos.get(id).y + NODE_H / 2;
    for (const e of valid) {
      const sd = sides(e, L);
      for (const [id, other, side, end] of [[e.source, e.target, sd[0], '>'], [e.target, e.source, sd[1], '<']]) {
        const key = id + '\u0000' + side;
        if (!ends.has(key)) ends.set(key, { id, list: [] });
        ends.get(key).list.push({ e, end, y: mid(other) });
      }
    }
    const endY = new Map();
    for (const { id, list } of ends.values()) {
      list.sort((a, b) => a.y - b.y || a.e.id.localeCompare(b.e.id) || a.end.localeCompare(b.end));
      const span = Math.min(NODE_H * 0.6, (list.length - 1) * 9);
      list.forEach((it, i) => endY.set(it.e.id + it.end,
        mid(id) - span / 2 + (list.length > 1 ? (span * i) / (list.length - 1) : 0)));
    }

    const obstacles = [...L.pos.values()].map((p) => ({ x: p.x - 4, y: p.y - 4, w: NODE_W + 8, h: NODE_H + 8 }));
    // place labels of the busiest / denied edges first so they get the best spots
    const ordered = valid.slice().sort((a, b) => (b.denied > 0) - (a.denied > 0) || edgeRate(b) - edgeRate(a) || a.id.localeCompare(b.id));
    const drawn = new Map();
    for (const e of ordered) drawn.set(e.id, drawEdge(e, L, endY, obstacles));
    for (const e of valid) layers.edges.appendChild(drawn.get(e.id));   // stable DOM order
    for (const n of g.nodes) if (L.pos.has(n.id)) drawNode(n, L.pos.get(n.id));

    bounds = { x: -MARGIN / 2, y: -MARGIN / 2, w: L.width + MARGIN, h: L.height + MARGIN };
    if (first || !userMoved) fitView();
  }

  function drawBand(b) {
    const ambient = b.info && b.info.ambient;
    const cls = 'namespace' + (ambient ? ' ambient' : '') + (b.name === '' ? ' external' : '');
    const grp = s('g', { class: cls, 'data-ns': b.name });
    grp.appendChild(s('rect', { class: 'ns-box', x: b.x, y: b.y, width: b.w, height: b.h, rx: 10 }));
    if (ambient) grp.appendChild(s('rect', { class: 'ns-stripe', x: b.x, y: b.y + 8, width: 4, height: b.h - 16, rx: 2 }));
    const { name: label, tag } = bandLabel(b.name, b.info);
    const nameEl = s('text', { class: 'ns-name', x: b.x + 16, y: b.y + 23, text: label });
    grp.appendChild(nameEl);
    layers.ns.appendChild(grp);
    let nameW = label.length * 9.5;
    try { nameW = nameEl.getComputedTextLength() || nameW; } catch (_) { /* not laid out */ }
    grp.appendChild(s('text', { class: 'ns-tag' + (ambient ? ' ambient' : ''), x: b.x + 28 + nameW, y: b.y + 22, text: tag }));
    if (b.empty) grp.appendChild(s('text', { class: 'ns-empty', x: b.x + 16, y: b.y + BAND_HEAD + 14, text: 'no workloads seen' }));
    grp.appendChild(title(b.name === '' ? 'outside the mesh' : 'namespace ' + b.name + (ambient ? ' (ambient)' : ' (not ambient)')));
  }

  function drawNode(n, p) {
    const cls = 'node' + (n.kind !== 'external' && n.kind !== 'service' && !n.enrolled ? ' unenrolled' : '');
    const g = s('g', { class: cls, 'data-id': n.id, 'data-kind': n.kind, 'data-policies': n.policies || 0, transform: 'translate(' + p.x + ',' + p.y + ')', tabindex: 0 });
    g.appendChild(title(nodeTitle(n)));
    g.appendChild(s('rect', { class: 'shape', width: NODE_W, height: NODE_H, rx: n.kind === 'service' ? NODE_H / 2 : 7 }));
    const pad = n.kind === 'service' ? 16 : 12;
    let caption = n.kind, capCls = 'caption';
    if (n.kind === 'service' && n.waypoint) { caption = 'via waypoint ' + n.waypoint; capCls += ' via'; }
    else if (n.kind === 'workload' && !n.enrolled) caption = 'workload · not enrolled';
    else if (n.kind === 'external') caption = 'outside the known workloads';
    if (n.kind === 'waypoint') {
      g.appendChild(s('path', { class: 'wp-mark', d: 'M' + (pad + 4) + ' 8l4 4l-4 4l-4-4z' }));
      g.appendChild(s('text', { class: capCls, x: pad + 12, y: 16, text: 'WAYPOINT' }));
    } else {
      g.appendChild(s('text', { class: capCls, x: pad, y: 16, text: fit(caption, NODE_W - 2 * pad + 4, '10px') }));
    }
    g.appendChild(s('text', { class: 'name', x: pad, y: 34, text: fit(n.name, NODE_W - 2 * pad, '600 15px') }));
    // badges: pods, policies (shield), denials (red)
    let x = pad;
    const by = 50;
    if (n.kind !== 'external') {
      const t = fmt.plural(n.pods || 0, 'pod');
      g.appendChild(s('text', { class: 'badge pods', x, y: by, text: t }, title(fmt.plural(n.pods || 0, 'pod'))));
      x += width(t, '11px') + 10;
    }
    if (n.policies > 0) {
      const b = s('g', { class: 'badge policies' }, title(fmt.plural(n.policies, 'policy', 'policies') + ' apply'));
      b.appendChild(s('use', { href: '#i-shield', x, y: by - 10, width: 10, height: 12 }));
      b.appendChild(s('text', { x: x + 13, y: by, text: String(n.policies) }));
      g.appendChild(b);
      x += 13 + String(n.policies).length * 7 + 10;
    }
    if (n.denied > 0) {
      const t = '✕ ' + fmt.num(n.denied);
      const w = width(t, '700 11px') + 9;
      const b = s('g', { class: 'badge denied' }, title(n.denied + ' denied into it by policy'));
      b.appendChild(s('rect', { class: 'pill', x, y: by - 10, width: w, height: 14, rx: 7 }));
      b.appendChild(s('text', { x: x + 4, y: by, text: t }));
      g.appendChild(b);
    }
    g.addEventListener('click', (ev) => { ev.stopPropagation(); if (!dragged) Ambit.select('node', n.id); });
    g.addEventListener('keydown', (ev) => { if (ev.key === 'Enter' || ev.key === ' ') { ev.preventDefault(); Ambit.select('node', n.id); } });
    layers.nodes.appendChild(g);
  }

  function drawEdge(e, L, endY, obstacles) {
    const ps = L.pos.get(e.source), pt = L.pos.get(e.target);
    const [da, db] = sides(e, L);
    const a = { x: da > 0 ? ps.x + NODE_W : ps.x, y: endY.get(e.id + '>') };
    let b = { x: db < 0 ? pt.x - 1 : pt.x + NODE_W + 1, y: endY.get(e.id + '<') };
    if (e.source === e.target) b = { x: pt.x + NODE_W - 30, y: pt.y + NODE_H + 1 };
    const c = curve(a, b, da, db);
    const denied = e.denied > 0;
    const mtls = ['all', 'some', 'none'].includes(e.mtls) ? e.mtls : 'none';
    const g = s('g', { class: 'edge' + (denied ? ' denied' : ''), 'data-id': e.id, 'data-denied': e.denied || 0, 'data-mtls': mtls });
    g.appendChild(title(edgeTitle(e)));
    const d = pathD(c);
    const marker = denied ? 'arrow-denied' : mtls === 'none' ? 'arrow-plain' : 'arrow';
    g.appendChild(s('path', { class: 'line', d, 'stroke-width': strokeWidth(e).toFixed(2), 'marker-end': 'url(#' + marker + ')', 'data-marker': marker }));
    g.appendChild(s('path', { class: 'hit', d }));

    // label: [lock] rate · bytes ; second line "✕ N denied"
    const text = edgeText(e);
    const lockW = mtls === 'none' ? 0 : 14;
    const line2 = denied ? '✕ ' + e.denied + ' denied' : null;
    const w = Math.ceil(Math.max(lockW + width(text, '11px'), line2 ? width(line2, '700 11.5px') : 0)) + 12;
    const hgt = line2 ? 32 : 18;
    // try spots along the curve, keep the first free one (or the least bad)
    // forward edges: the middles of the column gaps it crosses (first the one
    // after the source, then the one before the target); else along the curve
    const spots = [];
    if (da > 0 && db < 0 && b.x - a.x > 40) {
      const gaps = [];
      for (let gx = a.x + COL_GAP / 2; gx < b.x; gx += NODE_W + COL_GAP) gaps.push(gx);
      const order = gaps.length > 1 ? [gaps[0], gaps[gaps.length - 1], ...gaps.slice(1, -1)] : gaps;
      for (const gx of order) spots.push(tForX(c, gx));
    }
    spots.push(0.5, 0.35, 0.65, 0.22, 0.78);
    let best = null;
    spots.forEach((t, i) => {
      if (best && best.cost < 30) return;
      for (const dy of [0, -12, 12, -22, 22]) {
        const p = at(c, t);
        const box = { x: p.x - w / 2, y: p.y - hgt / 2 + dy, w, h: hgt };
        let cost = 0;
        for (const o of obstacles) cost += overlap(box, o);
        cost += i * 6 + Math.abs(dy);
        if (!best || cost < best.cost) best = { box, cost };
      }
    });
    const box = best.box;
    obstacles.push({ x: box.x - 2, y: box.y - 2, w: box.w + 4, h: box.h + 4 });
    const lab = s('g', { class: 'edge-label', transform: 'translate(' + box.x.toFixed(1) + ',' + box.y.toFixed(1) + ')' });
    lab.appendChild(s('rect', { class: 'label-box', width: w, height: hgt, rx: 4 }));
    if (mtls !== 'none') {
      lab.appendChild(s('use', { class: 'lock' + (mtls === 'some' ? ' half' : ''), href: mtls === 'all' ? '#i-lock' : '#i-lock-open', x: 6, y: 3, width: 10, height: 12 },
        title((mtls === 'all' ? 'mutual TLS on every connection' : 'mutual TLS on some connections only') +
          (e.identities && e.identities.length ? '; peer identity ' + e.identities.join(', ') : ''))));
    }
    lab.appendChild(s('text', { class: 'label', x: 6 + lockW, y: 13, text }));
    if (line2) lab.appendChild(s('text', { class: 'denied-count', x: 6, y: 27, text: line2 }));
    g.appendChild(lab);
    g.addEventListener('click', (ev) => { ev.stopPropagation(); if (!dragged) Ambit.select('edge', e.id); });
    return g;
  }

  function markSelected(sel) {
    for (const el of svg.querySelectorAll('.selected')) {
      el.classList.remove('selected');
      const line = el.querySelector('.line');
      if (line) line.setAttribute('marker-end', 'url(#' + line.getAttribute('data-marker') + ')');
    }
    if (!sel) return;
    const el = [...svg.querySelectorAll(sel.type === 'node' ? '.node' : '.edge')].find((x) => x.getAttribute('data-id') === sel.id);
    if (!el) return;
    el.classList.add('selected');
    const line = el.querySelector('.line');
    if (line) line.setAttribute('marker-end', 'url(#arrow-selected)');
  }

  // --- view: fit, pan, zoom ------------------------------------------------------
  function setView(v) {
    view = v;
    svg.setAttribute('viewBox', [v.x, v.y, v.w, v.h].map((n) => n.toFixed(1)).join(' '));
    // zoomed far out the numbers are unreadable: show only the denied labels
    const r = svg.getBoundingClientRect();
    svg.classList.toggle('far', r.width > 0 && r.width / v.w < 0.5);
  }
  function fitView() {
    if (!bounds) return;
    // match the aspect ratio of the window so later pans/zooms are exact
    const r = svg.getBoundingClientRect();
    const aspect = r.width > 0 && r.height > 0 ? r.width / r.height : 1.6;
    let { x, y, w, h } = bounds;
    w = Math.max(w, 400); h = Math.max(h, 200);
    if (w / h > aspect) { h = w / aspect; } else { const nw = h * aspect; x -= (nw - w) / 2; w = nw; }
    // don't blow a small graph up beyond 1.4×
    const scale = r.width > 0 ? r.width / w : 1;
    if (scale > 1.4) { const f = scale / 1.4; x -= (w * f - w) / 2; w *= f; h *= f; }
    setView({ x, y, w, h });
  }
  function toSvg(cx, cy) {
    const r = svg.getBoundingClientRect();
    return { x: view.x + ((cx - r.left) / r.width) * view.w, y: view.y + ((cy - r.top) / r.height) * view.h };
  }
  function zoom(factor, cx, cy) {
    if (!view) return;
    const r = svg.getBoundingClientRect();
    if (cx === undefined) { cx = r.left + r.width / 2; cy = r.top + r.height / 2; }
    const p = toSvg(cx, cy);
    const w = Math.min(Math.max(view.w * factor, 200), 40000);
    const f = w / view.w;
    setView({ x: p.x - (p.x - view.x) * f, y: p.y - (p.y - view.y) * f, w, h: view.h * f });
    userMoved = true;
  }

  let dragged = false;
  function init(el) {
    svg = el;
    layers = {
      ns: svg.querySelector('#layer-ns'), edges: svg.querySelector('#layer-edges'),
      nodes: svg.querySelector('#layer-nodes'),
    };
    let start = null;
    svg.addEventListener('pointerdown', (ev) => {
      if (ev.button !== 0 || !view) return;
      start = { x: ev.clientX, y: ev.clientY, view: { ...view }, id: ev.pointerId };
      dragged = false;
    });
    svg.addEventListener('pointermove', (ev) => {
      if (!start || ev.pointerId !== start.id) return;
      const dx = ev.clientX - start.x, dy = ev.clientY - start.y;
      if (!dragged && Math.hypot(dx, dy) < 4) return;
      if (!dragged) { dragged = true; svg.setPointerCapture(ev.pointerId); svg.classList.add('dragging'); }
      const r = svg.getBoundingClientRect();
      const k = start.view.w / r.width;
      setView({ ...start.view, x: start.view.x - dx * k, y: start.view.y - dy * k });
      userMoved = true;
    });
    const end = () => {
      start = null;
      svg.classList.remove('dragging');
      setTimeout(() => { dragged = false; }, 0);
    };
    svg.addEventListener('pointerup', end);
    svg.addEventListener('pointercancel', end);
    svg.addEventListener('click', () => { if (!dragged && Ambit.state.selected) Ambit.deselect(); });
    svg.addEventListener('wheel', (ev) => {
      ev.preventDefault();
      zoom(Math.exp(ev.deltaY * (ev.deltaMode === 1 ? 0.05 : 0.0015)), ev.clientX, ev.clientY);
    }, { passive: false });
    document.getElementById('zoom-in').addEventListener('click', () => zoom(1 / 1.25));
    document.getElementById('zoom-out').addEventListener('click', () => zoom(1.25));
    document.getElementById('zoom-fit').addEventListener('click', () => { userMoved = false; fitView(); });
    // a new window shape may want another arrangement of the namespaces
    let relayout = null;
    window.addEventListener('resize', () => {
      if (userMoved) return;
      fitView();
      clearTimeout(relayout);
      relayout = setTimeout(() => {
        if (userMoved || !lastGraph) return;
        lastSig = null;
        prevPick = '';   // the window changed: take the best arrangement for it
        render(lastGraph, false);
        if (Ambit.state.selected) markSelected(Ambit.state.selected);
      }, 200);
    });
  }

  Ambit.graph = { init, render, markSelected, fitView, layout };
})(window.Ambit);
