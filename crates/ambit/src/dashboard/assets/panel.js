// ambit dashboard: the side panel (#details) with a node's or an edge's
// details from /api/node and /api/edge.  The panel element stays; only its
// contents change.  All API text goes through textContent.
'use strict';

(function (Ambit) {
  const { h, clear, fmt } = Ambit;
  let root = null, titleEl = null, body = null;
  let current = null;      // {type, id}
  let token = 0;           // answers to older requests are dropped

  function nodeLabel(id) {
    const n = Ambit.state.nodesById.get(id);
    if (!n) return id;
    // A Service and a workload may share a name: say which.
    if (n.kind === 'external') return n.name;
    return (n.kind === 'service' ? 'service ' : '') + n.namespace + '/' + n.name;
  }
  function nodeLink(id) {
    const known = Ambit.state.nodesById.has(id);
    if (!known) return h('span', { class: 'mono', text: id });
    return h('button', { class: 'link', type: 'button', title: id, text: nodeLabel(id), onclick: () => Ambit.select('node', id) });
  }
  // the waypoint field is "namespace/name"; find the waypoint's node
  function waypointId(ref) {
    for (const n of Ambit.state.nodesById.values()) {
      if ((n.kind === 'waypoint' || n.kind === 'workload') && n.namespace + '/' + n.name === ref) return n.id;
    }
    return null;
  }
  function section(name, count, ...content) {
    const title = count === null ? name : name + ' (' + count + ')';
    return [h('h3', { text: title }), ...content.flat(2).filter(Boolean)];
  }
  function none(text) { return h('p', { class: 'none', text: text || 'none' }); }
  function table(head, rows) {
    return h('table', null,
      h('thead', null, h('tr', null, head.map((c) => h('th', { text: c })))),
      h('tbody', null, rows));
  }
  function time(t) {
    const d = fmt.parseTime(t);
    return h('span', { title: String(t), text: d ? fmt.clock(d) : String(t || '') });
  }
  function facts(pairs) {
    const dl = h('dl', { class: 'facts' });
    for (const [k, v] of pairs) {
      if (v === null || v === undefined || v === '') continue;
      dl.appendChild(h('dt', { text: k }));
      dl.appendChild(h('dd', null, v));
    }
    return dl;
  }

  function policyCard(p) {
    const action = String(p.action || '');
    const card = h('div', { class: 'card policy', 'data-policy': (p.namespace || '') + '/' + (p.name || '') },
      h('div', { class: 'card-head' },
        h('span', { class: 'policy-name', text: (p.namespace || '') + '/' + (p.name || '') }),
        action ? h('span', { class: 'action' + (/deny/i.test(action) ? ' deny' : ''), text: action }) : null,
        h('span', { class: 'policy-kind', text: p.kind || '' })),
      p.appliesTo ? h('p', null, h('span', { class: 'muted', text: 'applies to ' }), p.appliesTo) : null,
      p.enforcedBy ? h('p', null, h('span', { class: 'muted', text: 'enforced by ' }), p.enforcedBy) : null);
    const rules = Array.isArray(p.rules) ? p.rules : [];
    card.appendChild(rules.length ? h('ul', { class: 'rules' }, rules.map((r) => h('li', { text: r })))
      : h('p', { class: 'muted', text: 'no rules' }));
    const warnings = Array.isArray(p.warnings) ? p.warnings : [];
    if (warnings.length) card.appendChild(h('ul', { class: 'warnings' }, warnings.map((w) => h('li', { text: w }))));
    return card;
  }
  function policies(list, heading) {
    list = Array.isArray(list) ? list : [];
    return section(heading, list.length, list.length ? list.map(policyCard) : none());
  }

  function denialCard(d) {
    const refs = Array.isArray(d.policies) ? d.policies : [];
    return h('div', { class: 'card denial' },
      h('div', { class: 'card-head' }, time(d.time), h('span', { class: 'muted', text: 'on ' + (d.node || '?') })),
      h('p', null, h('span', { class: 'muted', text: 'from ' }),
        d.source ? h('span', { class: 'mono', text: d.source }) : h('span', { text: 'no identity (plaintext)' }),
        d.sourceAddress ? h('span', { class: 'muted', text: ' at ' + d.sourceAddress }) : null),
      d.destination ? h('p', null, h('span', { class: 'muted', text: 'to ' }), d.destination) : null,
      h('p', { class: 'bad', text: d.reason || 'denied' }),
      refs.length ? h('p', { class: 'denied-by' }, h('span', { class: 'muted', text: 'denied by ' }),
        refs.map((r) => h('button', { class: 'link policy-ref', type: 'button', text: r, onclick: () => flashPolicy(r) }))) : null);
  }
  function denials(list, heading) {
    list = Array.isArray(list) ? list : [];
    return section(heading, list.length, list.length ? list.map(denialCard) : none('no denied connections seen'));
  }
  function flashPolicy(ref) {
    const card = [...body.querySelectorAll('.card.policy')].find((c) => c.getAttribute('data-policy') === ref);
    if (!card) return;
    card.scrollIntoView({ block: 'nearest', behavior: 'smooth' });
    card.classList.add('flash');
    setTimeout(() => card.classList.remove('flash'), 1200);
  }

  // --- node --------------------------------------------------------------------
  function renderNode(d) {
    const n = Ambit.state.nodesById.get(d.id) || {};
    const kind = d.kind || n.kind || 'node';
    setTitle(kind, d.kind === 'external' ? d.name : (d.namespace ? d.namespace + '/' : '') + d.name);
    const out = [];
    let wp = null;
    if (d.waypoint) {
      const wid = waypointId(d.waypoint);
      wp = wid ? h('button', { class: 'link', type: 'button', text: d.waypoint, onclick: () => Ambit.select('node', wid) })
        : h('span', { text: d.waypoint });
    }
    out.push(facts([
      ['identity', d.identity ? h('span', { class: 'mono', text: d.identity }) : null],
      ['waypoint', wp ? h('span', null, 'traffic goes through ', wp) : null],
      ['in the mesh', kind === 'external' ? null : (n.enrolled === false ? h('span', { class: 'warn', text: 'not enrolled' }) : 'enrolled')],
      ['denied into it', n.denied > 0 ? h('span', { class: 'bad', text: String(n.denied) }) : null],
    ]));
    if (kind === 'service') {
      const ws = Array.isArray(d.workloads) ? d.workloads : [];
      out.push(...section('Selects workloads', ws.length, ws.length
        ? h('ul', { class: 'plain-list' }, ws.map((w) => h('li', null, nodeLink(w)))) : none()));
    }
    const pods = Array.isArray(d.pods) ? d.pods : [];
    if (kind !== 'external' || pods.length) {
      out.push(...section('Pods', pods.length, pods.length ? table(['pod', 'node', 'IP', 'phase', 'enrolled'], pods.map((p) => h('tr', null,
        h('td', { text: p.name }), h('td', { text: p.node }), h('td', { class: 'mono', text: p.ip }),
        h('td', { class: p.phase === 'Ready' || p.phase === 'Running' ? 'ok' : 'warn', text: p.phase }),
        h('td', { class: p.enrolled === 'enabled' ? '' : 'warn', text: p.enrolled })))) : none()));
    }
    const certs = Array.isArray(d.certificates) ? d.certificates : [];
    if (kind !== 'service' && kind !== 'external') {
      const now = Date.now();
      out.push(...section('Certificates', certs.length, certs.length ? table(['node', 'state', 'expires'], certs.map((c) => {
        const exp = fmt.parseTime(c.expires);
        const left = exp ? exp.getTime() - now : null;
        return h('tr', { title: c.identity || '' }, h('td', { text: c.node }),
          h('td', { class: c.state === 'Available' ? 'ok' : 'warn', text: c.state }),
          h('td', { title: String(c.expires || '') }, exp ? h('span', { class: left < 0 ? 'bad' : left < 3600e3 ? 'warn' : '',
            text: (left < 0 ? 'expired ' : '') + fmt.relative(left) }) : String(c.expires || ''),
          exp ? h('div', { class: 'sub', text: exp.toISOString().replace('.000Z', 'Z') }) : null));
      })) : none('no certificates issued')));
    }
    const svcs = Array.isArray(d.services) ? d.services : [];
    if (kind !== 'service' && svcs.length) {
      out.push(...section('Services', svcs.length, table(['service', 'cluster IP', 'ports'], svcs.map((v) => h('tr', null,
        h('td', { text: v.namespace + '/' + v.name }), h('td', { class: 'mono', text: v.clusterIp }),
        h('td', { text: (Array.isArray(v.ports) ? v.ports : []).join(', ') }))))));
    } else if (kind === 'service' && svcs.length) {
      out.push(facts(svcs.map((v) => ['cluster IP', h('span', null, h('span', { class: 'mono', text: v.clusterIp }),
        ' · ports ' + (Array.isArray(v.ports) ? v.ports : []).join(', '))])));
    }
    out.push(...policies(d.policies, 'Policies'));
    out.push(...denials(d.denials, 'Recent denied connections'));
    return out;
  }

  // --- edge --------------------------------------------------------------------
  function renderEdge(d) {
    const e = Ambit.state.edgesById.get(d.id) || {};
    const src = d.source || e.source, dst = d.target || e.target;
    setTitle('connection', nodeLabel(src) + ' → ' + nodeLabel(dst));
    const out = [];
    const mtlsWords = { all: 'every connection', some: 'some connections only', none: 'none (plaintext)' };
    out.push(facts([
      ['from', nodeLink(src)], ['to', nodeLink(dst)],
      ['mTLS', e.mtls ? h('span', { class: e.mtls === 'all' ? 'ok' : 'warn', text: mtlsWords[e.mtls] || e.mtls }) : null],
      ['connections', e.connections !== undefined ? e.connections + ' (' + fmt.num(e.connectionsPerSecond || 0) + '/s)' : null],
      ['bytes', e.bytes !== undefined ? fmt.bytes(e.bytes) + ' (' + fmt.bytes(e.bytesPerSecond || 0) + '/s)' : null],
      ['HTTP requests', e.requests > 0 ? e.requests + ' (' + fmt.num(e.requestsPerSecond || 0) + '/s), ' + fmt.plural(e.errors || 0, 'error') : null],
      ['denied', e.denied > 0 ? h('span', { class: 'bad', text: String(e.denied) }) : null],
      ['identities', Array.isArray(e.identities) && e.identities.length
        ? h('div', null, e.identities.map((i) => h('div', { class: 'mono', text: i }))) : null],
    ]));
    const reqs = Array.isArray(d.requests) ? d.requests : [];
    if (reqs.length || e.requests > 0) {
      out.push(...section('HTTP answers', null, reqs.length ? table(['code', 'count', 'flags'], reqs.map((r) => {
        const code = String(r.code);
        return h('tr', null, h('td', { class: code === '403' ? 'bad' : /^[23]/.test(code) ? 'ok' : 'warn', text: code }),
          h('td', { class: 'num', text: String(r.count) }), h('td', { text: r.flags || '' }));
      })) : none()));
    }
    out.push(...denials(d.denials, 'Denied'));
    out.push(...policies(d.policies, 'Policies that denied'));
    const conns = Array.isArray(d.connections) ? d.connections : [];
    out.push(...section('Recent connections', conns.length, conns.length
      ? table(['time', 'from → to', 'sent / recv', 'took'], conns.map((c) => h('tr', { title: [
        c.direction ? c.direction + ', reported by ' + c.reporter : '', c.service ? 'service ' + c.service : '',
        c.identity ? 'identity ' + c.identity : 'no identity'].filter(Boolean).join('\n') },
        h('td', null, time(c.time), h('div', { class: 'sub', text: (c.reporter || '') + (c.direction ? ' ' + c.direction : '') })),
        h('td', null, h('span', { class: 'mono', text: c.sourceAddress }), ' → ', h('span', { class: 'mono', text: c.destinationAddress }),
          c.error ? h('div', { class: 'warn', text: String(c.error) }) : null),
        h('td', { class: 'num', text: fmt.bytes(c.bytesSent) + ' / ' + fmt.bytes(c.bytesReceived) }),
        h('td', { class: 'num', text: c.duration || '' }))))
      : none('no connections recorded')));
    return out;
  }

  // --- open / close -------------------------------------------------------------
  function setTitle(kind, name) {
    clear(titleEl);
    titleEl.appendChild(h('div', { class: 'kind ' + kind, text: kind }));
    titleEl.appendChild(h('h2', { text: name }));
  }

  async function load(keepScroll) {
    const sel = current;
    const my = ++token;
    const url = '/api/' + sel.type + '?id=' + encodeURIComponent(sel.id);
    const scroll = body.scrollTop;
    if (!keepScroll) {
      const item = (sel.type === 'node' ? Ambit.state.nodesById : Ambit.state.edgesById).get(sel.id);
      setTitle(sel.type === 'node' ? (item ? item.kind : 'node') : 'connection',
        sel.type === 'node' ? nodeLabel(sel.id) : (item ? nodeLabel(item.source) + ' → ' + nodeLabel(item.target) : sel.id));
      clear(body);
      body.appendChild(h('p', { class: 'loading', text: 'loading…' }));
    }
    let content;
    try {
      const resp = await fetch(url, { headers: { Accept: 'application/json' }, cache: 'no-store' });
      let data = null;
      try { data = await resp.json(); } catch (_) { data = null; }
      if (!resp.ok) throw new Error(data && data.error ? String(data.error) : 'HTTP ' + resp.status + ' from ' + url);
      if (!data) throw new Error('the answer from ' + url + ' is not JSON');
      if (my !== token) return;
      content = sel.type === 'node' ? renderNode(data) : renderEdge(data);
    } catch (e) {
      if (my !== token) return;
      content = [h('p', { class: 'error', text: e && e.message ? e.message : String(e) })];
    }
    const present = (sel.type === 'node' ? Ambit.state.nodesById : Ambit.state.edgesById).has(sel.id);
    if (!present) content.unshift(h('p', { class: 'note', text: 'no longer in the graph' }));
    clear(body);
    for (const c of content) body.appendChild(c);
    if (keepScroll) body.scrollTop = scroll;
  }

  Ambit.panel = {
    init(el) { root = el; titleEl = el.querySelector('#details-title'); body = el.querySelector('#details-body'); },
    open(type, id) {
      current = { type, id };
      root.hidden = false;
      root.setAttribute('data-type', type);
      root.setAttribute('data-id', id);
      body.scrollTop = 0;
      load(false);
    },
    reload() { if (current && !root.hidden) load(true); },
    close() {
      current = null;
      token++;
      root.hidden = true;
      root.removeAttribute('data-id');
    },
  };
})(window.Ambit);
