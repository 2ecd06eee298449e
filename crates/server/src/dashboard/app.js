// The Tessera dashboard: every figure comes from the management API of the daemon that serves
// this page, with the session cookie the login form set. No framework, no build step.
'use strict';

const REFRESH_MS = 2000;

// ---- small helpers ----

function h(tag, attrs, ...children) {
  const el = tag === 'svg' || tag === 'polyline' || tag === 'line' || tag === 'text'
    ? document.createElementNS('http://www.w3.org/2000/svg', tag)
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'value') el.value = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// The session's key: given once, in the address's fragment, to the page the login led to.
// The API wants it besides the cookie, which the browser would also send to a page served
// on another port of this host; the key stays with this origin.
(function takeKey() {
  const m = location.hash.match(/^#key=([0-9a-f]{64})$/);
  if (m) {
    localStorage.setItem('tessera-key', m[1]);
    history.replaceState(null, '', location.pathname + location.search);
  }
})();
const sessionKey = () => localStorage.getItem('tessera-key') || '';

async function api(method, path, body) {
  const sent = sessionKey();
  const opts = { method, credentials: 'same-origin', headers: { 'x-tessera-key': sent } };
  if (body !== undefined) {
    opts.headers['content-type'] = 'application/json';
    opts.body = JSON.stringify(body);
  }
  const r = await fetch(path, opts);
  if (r.status === 401) {
    // The session ended, or this page lacks its key: log out, and the page answers with the
    // login form. Unless a login in another tab gave a new key meanwhile: then only again.
    if (sessionKey() === sent) {
      localStorage.removeItem('tessera-key');
      await fetch('/ui/logout', { method: 'POST', credentials: 'same-origin' }).catch(() => {});
    }
    location.reload();
    throw new Error('logged out');
  }
  const text = await r.text();
  const json = text ? JSON.parse(text) : null;
  if (!r.ok) throw new Error(json && json.error ? json.error.message : `HTTP ${r.status}`);
  return json;
}

const get = (path) => api('GET', path);
const enc = encodeURIComponent;

function size(n) {
  if (n === null || n === undefined) return '-';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return i === 0 ? `${v} B` : `${v.toFixed(1)} ${units[i]}`;
}

function rate(n) { return `${size(n)}/s`; }
function ms(s) { return s === null || s === undefined ? '-' : `${(s * 1000).toFixed(s < 0.001 ? 3 : 2)} ms`; }
function when(t) { return t ? new Date(t * 1000).toLocaleString() : '-'; }
function badge(state) { return h('span', { class: `badge ${state}` }, state); }

function bar(done, total) {
  const inner = h('div');
  inner.style.width = `${total ? Math.min(100, (100 * done) / total) : 0}%`;
  return h('div', { class: 'bar', title: `${size(done)} of ${size(total)}` }, inner);
}

function notice(text, ok) {
  const n = document.getElementById('notice');
  n.textContent = text;
  n.className = ok ? 'ok' : '';
  n.hidden = !text;
  if (text) setTimeout(() => { if (n.textContent === text) n.hidden = true; }, 8000);
}

async function act(what, f) {
  try {
    await f();
    notice(what, true);
    refresh();
  } catch (e) {
    notice(`${what}: ${e.message}`);
  }
}

// ---- charts: an SVG polyline per series ----

function chart(series, format) {
  const W = 800;
  const H = 180;
  const L = 70;
  const B = 20;
  const all = series.flatMap((s) => s.points);
  const svg = h('svg', { class: 'chart', viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none' });
  if (all.length < 2) {
    svg.append(h('text', { x: L + 10, y: H / 2 }, 'collecting: a point every 5 seconds'));
    return svg;
  }
  const t0 = Math.min(...all.map((p) => p[0]));
  const t1 = Math.max(...all.map((p) => p[0]));
  const vmax = Math.max(...all.map((p) => p[1]), 1e-9);
  const x = (t) => L + ((W - L - 10) * (t - t0)) / Math.max(t1 - t0, 1);
  const y = (v) => H - B - ((H - B - 10) * v) / vmax;
  svg.append(h('line', { class: 'axis', x1: L, y1: H - B, x2: W - 10, y2: H - B }));
  svg.append(h('line', { class: 'axis', x1: L, y1: 10, x2: L, y2: H - B }));
  svg.append(h('text', { x: 2, y: 18 }, format(vmax)));
  svg.append(h('text', { x: 2, y: H - B }, format(0)));
  svg.append(h('text', { x: L, y: H - 4 }, new Date(t0 * 1000).toLocaleTimeString()));
  svg.append(h('text', { x: W - 80, y: H - 4 }, new Date(t1 * 1000).toLocaleTimeString()));
  series.forEach((s, i) => {
    const pts = s.points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(' ');
    svg.append(h('polyline', { class: `s${i}`, points: pts }));
  });
  return svg;
}

function legend(series) {
  return h('div', { class: 'legend' }, series.map((s, i) => h('span', { class: `s${i}` }, `— ${s.name}`)));
}

function ioCharts(points) {
  const iops = [
    { name: 'reads/s', points: points.map((p) => [p.time, p.read_iops]) },
    { name: 'writes/s', points: points.map((p) => [p.time, p.write_iops]) },
  ];
  const lat = [
    { name: 'latency p50', points: points.filter((p) => p.latency_p50_seconds !== null).map((p) => [p.time, p.latency_p50_seconds]) },
    { name: 'latency p99', points: points.filter((p) => p.latency_p99_seconds !== null).map((p) => [p.time, p.latency_p99_seconds]) },
  ];
  return [
    h('h3', {}, 'IOPS, last hour'), legend(iops), chart(iops, (v) => v.toFixed(0)),
    h('h3', {}, 'Latency, last hour'), legend(lat), chart(lat, ms),
  ];
}

// Sums the vdisks' points interval by interval (the newest of each aligned).
function totalPoints(stats) {
  const n = Math.max(0, ...stats.vdisks.map((v) => v.points.length));
  const out = [];
  for (let k = n; k >= 1; k--) {
    const at = stats.vdisks.map((v) => v.points[v.points.length - k]).filter(Boolean);
    if (!at.length) continue;
    const sum = (f) => at.reduce((a, p) => a + p[f], 0);
    const worst = (f) => {
      const v = at.map((p) => p[f]).filter((x) => x !== null);
      return v.length ? Math.max(...v) : null;
    };
    out.push({
      time: Math.max(...at.map((p) => p.time)),
      read_iops: sum('read_iops'),
      write_iops: sum('write_iops'),
      read_bytes_per_second: sum('read_bytes_per_second'),
      write_bytes_per_second: sum('write_bytes_per_second'),
      latency_p50_seconds: worst('latency_p50_seconds'),
      latency_p99_seconds: worst('latency_p99_seconds'),
    });
  }
  return out;
}

// ---- pages ----

async function overview() {
  const [pools, stats, events, jobs] = await Promise.all([
    get('/api/pools'), get('/api/stats/io'), get('/api/events?limit=8'), get('/api/jobs'),
  ]);
  const total = totalPoints(stats);
  const now = total[total.length - 1] || {};
  const cap = pools.reduce((a, p) => {
    if (p.capacity) { a.total += p.capacity.total_bytes; a.used += p.capacity.used_bytes; }
    return a;
  }, { total: 0, used: 0 });
  // A pool being destroyed is on its way out, not a fault.
  const bad = pools.filter((p) => p.health !== 'healthy' && p.health !== 'destroying');
  const cards = h('div', { class: 'cards' },
    h('div', { class: 'card', id: 'health' },
      h('div', { class: 'label' }, 'Health'),
      h('div', { class: 'big' }, bad.length ? badge(bad.some((p) => p.health !== 'degraded') ? 'failed' : 'degraded') : badge('healthy')),
      h('div', { class: 'label' }, `${pools.length} pool(s), ${bad.length} not healthy`)),
    h('div', { class: 'card' },
      h('div', { class: 'label' }, 'Capacity'),
      h('div', { class: 'big' }, size(cap.total)),
      bar(cap.used, cap.total),
      h('div', { class: 'label' }, `${size(cap.used)} used, ${size(cap.total - cap.used)} free`)),
    h('div', { class: 'card', id: 'iops' },
      h('div', { class: 'label' }, 'IOPS now (read / write)'),
      h('div', { class: 'big' }, `${(now.read_iops || 0).toFixed(0)} / ${(now.write_iops || 0).toFixed(0)}`),
      h('div', { class: 'label' }, `${rate(now.read_bytes_per_second || 0)} read, ${rate(now.write_bytes_per_second || 0)} written`)),
    h('div', { class: 'card' },
      h('div', { class: 'label' }, 'Latency now (p50 / p99)'),
      h('div', { class: 'big' }, `${ms(now.latency_p50_seconds)} / ${ms(now.latency_p99_seconds)}`),
      h('div', { class: 'label' }, `${jobs.filter((j) => j.state === 'running').length} job(s) running`)));
  return [
    cards,
    h('section', {}, h('h2', {}, 'Pools'), poolTable(pools)),
    h('section', {}, ...ioCharts(total)),
    h('section', {}, h('h2', {}, 'Latest events'), eventTable(events.events.slice().reverse())),
  ];
}

function poolTable(pools) {
  if (!pools.length) return h('p', { class: 'muted' }, 'No pools yet: create one on the Pools page.');
  return h('table', { id: 'pool-table' },
    h('tr', {}, h('th', {}, 'Pool'), h('th', {}, 'Health'), h('th', { class: 'num' }, 'Size'), h('th', {}, 'Used'),
      h('th', { class: 'num' }, 'Disks'), h('th', { class: 'num' }, 'Vdisks'), h('th', {}, 'Problem')),
    pools.map((p) => h('tr', { 'data-pool': p.name },
      h('td', {}, p.name), h('td', { class: 'pool-health' }, badge(p.health)),
      h('td', { class: 'num' }, size(p.capacity ? p.capacity.total_bytes : null)),
      h('td', {}, p.capacity ? bar(p.capacity.used_bytes, p.capacity.total_bytes) : '-'),
      h('td', { class: 'num' }, `${p.healthy_disks}/${p.disks}`),
      h('td', { class: 'num' }, p.vdisks),
      h('td', { class: 'problem' }, p.problem || (p.warnings || []).join(' ') || ''))));
}

// What losing this disk would mean, in a sentence.
function ifItFails(d, pool) {
  if (d.state !== 'healthy') return d.problem || '';
  if (d.usage === 'cache') return 'the write-back cache log is kept on two cache disks: the other keeps it';
  if (!d.used_bytes) return 'holds no data: nothing to rebuild';
  const simple = pool.vdisk_list.filter((v) => v.layout.kind === 'simple').map((v) => v.name);
  if (simple.length) return `the simple vdisk(s) ${simple.join(', ')} would lose data; the others rebuild ${size(d.used_bytes)}`;
  if (pool.health !== 'healthy') return `the pool is already ${pool.health}: data with no copy left would be unreadable`;
  return `${size(d.used_bytes)} to rebuild from the other copies; no data lost`;
}

// Where a pool on Ceph RADOS is served, in a sentence (null for a pool on local disks).
function radosLine(p) {
  const r = p.rados;
  if (!r) return null;
  const owner = r.here
    ? `served here at epoch ${r.epoch}${r.client ? ` (client ${r.client})` : ''}`
    : r.owner ? `served by gateway ${r.owner} at epoch ${r.epoch}; standby here` : 'served by no gateway yet';
  const counts = `taken over here ${r.takeovers} time(s)${r.failed_takes ? `, ${r.failed_takes} failed attempt(s)` : ''} since this daemon started`;
  return h('p', { class: 'muted rados' }, `In RADOS pool ${r.rados_pool}: ${owner}; ${counts}.`);
}

// The pool's integrity checks, in a sentence: the scrub (data against checksums and copies)
// and the metadata scan, their last results and what runs next.
function integrityLine(p) {
  const sc = p.scrub || {};
  let scrub = sc.state === 'running' ? 'scrub running'
    : sc.last ? `last scrub ${when(sc.last.finished_at)}: ${sc.last.repaired} block(s) repaired, ${sc.last.unrecoverable} lost`
    : 'never scrubbed';
  if (sc.next_due) scrub += `, next ${when(sc.next_due)}`;
  let scan = 'never scanned';
  if (p.scan) {
    const open = p.scan.findings - (p.scan.spotfix ? p.scan.spotfix.fixed : 0);
    scan = `last scan ${when(p.scan.finished_at)}: ${p.scan.findings} finding(s), ${open} open`;
  }
  if (p.scan_next_due) scan += `, next ${when(p.scan_next_due)}`;
  return h('p', { class: 'muted', id: `integrity-${p.name}` }, `Integrity: ${scrub}; ${scan}.`);
}

async function pools() {
  const list = await get('/api/pools');
  const served = (p) => p.health !== 'unavailable' && p.health !== 'destroying';
  const details = await Promise.all(list.filter(served).map((p) => get(`/api/pools/${enc(p.name)}`)));
  const out = [h('div', { class: 'actions' }, h('button', { class: 'primary', id: 'create-pool', onclick: poolWizard }, 'Create a pool…'))];
  if (!list.length) out.push(h('p', { class: 'muted' }, 'No pools yet.'));
  // Pools on RADOS that another gateway serves: where they are, and who serves them; and
  // pools being destroyed here: what holds their destruction up.
  for (const p of list.filter((p) => (p.health === 'unavailable' && p.rados) || p.health === 'destroying')) {
    out.push(h('section', { id: `pool-${p.name}` },
      h('h2', {}, p.name, h('span', { class: 'pool-health' }, badge(p.health))),
      p.problem ? h('p', { class: 'problem' }, p.problem) : null,
      p.health === 'destroying' ? null : radosLine(p)));
  }
  for (const p of details) {
    out.push(h('section', { id: `pool-${p.name}` },
      h('h2', {}, p.name, h('span', { class: 'pool-health' }, badge(p.health)),
        h('span', { class: 'actions' },
          h('button', { id: `repair-${p.name}`, onclick: () => act(`repair of ${p.name} started`, () => api('POST', `/api/pools/${enc(p.name)}/repair`, {})) }, 'Repair'),
          h('button', { onclick: () => act(`scrub of ${p.name} started`, () => api('POST', `/api/pools/${enc(p.name)}/scrub`, {})) }, 'Scrub'),
          h('button', { id: `scan-${p.name}`, onclick: () => act(`scan of ${p.name} started`, () => api('POST', `/api/pools/${enc(p.name)}/scan`, {})) }, 'Scan'))),
      p.problem ? h('p', { class: 'problem' }, p.problem) : null,
      (p.warnings || []).map((w) => h('p', { class: 'problem' }, w)),
      radosLine(p),
      integrityLine(p),
      h('p', { class: 'muted' }, p.capacity
        ? `${size(p.capacity.total_bytes)} raw, ${size(p.capacity.used_bytes)} used, ${size(p.capacity.free_bytes)} free, ${size(p.capacity.spare_bytes)} on spares; repair needed: ${size(p.repair_needed_bytes)}`
        : ''),
      h('table', {},
        h('tr', {}, h('th', {}, 'Disk'), h('th', {}, 'State'), h('th', {}, 'Usage'), h('th', { class: 'num' }, 'Size'),
          h('th', {}, 'Used'), h('th', { class: 'num' }, 'Reads / writes'), h('th', { class: 'num' }, 'Latency p99 (read / write)'),
          h('th', { class: 'num' }, 'Errors (read / checksum)'), h('th', {}, 'If it fails'), h('th', {}, '')),
        p.disk_list.map((d) => h('tr', { 'data-disk': d.path },
          h('td', {}, d.path), h('td', {}, badge(d.state)), h('td', {}, d.usage),
          h('td', { class: 'num' }, size(d.size)), h('td', {}, bar(d.used_bytes, d.size)),
          h('td', { class: 'num' }, d.io ? `${d.io.reads} / ${d.io.writes}` : '-'),
          h('td', { class: 'num' }, d.io ? `${d.io.reads ? ms(d.io.read_p99_us / 1e6) : '-'} / ${d.io.writes ? ms(d.io.write_p99_us / 1e6) : '-'}` : '-'),
          h('td', { class: 'num' }, `${d.errors.read} / ${d.errors.checksum}`),
          h('td', {}, ifItFails(d, p)),
          h('td', { class: 'actions' }, d.state === 'healthy' ? [
            h('button', { class: 'danger fail-disk', onclick: () => confirmDisk(p.name, d, 'fail') }, 'Fail'),
            h('button', { onclick: () => confirmDisk(p.name, d, 'retire') }, 'Retire'),
          ] : [])))),
      h('p', { class: 'muted' }, `Vdisks: ${p.vdisk_list.map((v) => v.name).join(', ') || 'none'}`)));
  }
  return out;
}

function confirmDisk(pool, d, action) {
  const what = action === 'fail'
    ? `Fail ${d.path}? The pool reads from the other copies from now on, and a repair rebuilds what it held.`
    : `Retire ${d.path}? No new data goes to it; a repair moves its data off.`;
  dialog(`${action === 'fail' ? 'Fail' : 'Retire'} a disk`, [h('p', {}, what)], async () => {
    await api('POST', `/api/pools/${enc(pool)}/disks/${enc(d.id)}/${action}`);
    return `disk ${d.path}: ${action === 'fail' ? 'failed' : 'retired'}`;
  }, action === 'fail' ? 'Fail it' : 'Retire it');
}

async function vdisks() {
  const [list, targets, exports, stats] = await Promise.all([
    get('/api/vdisks'), get('/api/targets'), get('/api/nbd/exports'), get('/api/stats/io'),
  ]);
  const presented = (v) => {
    const full = `${v.pool}/${v.name}`;
    const as = [];
    for (const t of targets) for (const l of t.luns) if (l.vdisk === full) as.push(`iSCSI ${t.iqn} LUN ${l.lun}`);
    for (const e of exports) if (e.vdisk === full) as.push(`NBD ${e.name}`);
    return as.join(', ') || '-';
  };
  const out = [h('div', { class: 'actions' }, h('button', { class: 'primary', id: 'create-vdisk', onclick: vdiskWizard }, 'Create a vdisk…'))];
  out.push(h('section', {}, h('table', { id: 'vdisk-table' },
    h('tr', {}, h('th', {}, 'Vdisk'), h('th', { class: 'num' }, 'Size'), h('th', {}, 'Layout'), h('th', {}, 'Provisioning'),
      h('th', { class: 'num' }, 'Allocated'), h('th', { class: 'num' }, 'Exclusive'), h('th', { class: 'num' }, 'Shared'),
      h('th', { class: 'num' }, 'Snapshots'), h('th', {}, 'Presented as'), h('th', {}, '')),
    list.map((v) => h('tr', { 'data-vdisk': `${v.pool}/${v.name}` },
      h('td', {}, `${v.pool}/${v.name}`), h('td', { class: 'num' }, size(v.size)), h('td', {}, v.layout_description),
      h('td', {}, v.provisioning), h('td', { class: 'num' }, size(v.allocated_bytes)),
      h('td', { class: 'num' }, size(v.exclusive_bytes)), h('td', { class: 'num' }, size(v.shared_bytes)),
      h('td', { class: 'num' }, v.snapshots), h('td', { class: 'presented' }, presented(v)),
      h('td', { class: 'actions' },
        h('button', { onclick: () => snapshotWizard(v) }, 'Snapshot'),
        h('button', { onclick: () => { chartOf = `${v.pool}/${v.name}`; refresh(); } }, 'Chart')))))));
  const shown = stats.vdisks.find((s) => `${s.pool}/${s.vdisk}` === chartOf);
  if (chartOf) {
    out.push(h('section', { id: 'vdisk-chart' }, h('h2', {}, chartOf), ...ioCharts(shown ? shown.points : [])));
  }
  return out;
}
let chartOf = null;

async function targets() {
  const list = await get('/api/targets');
  if (!list.length) return [h('p', { class: 'muted' }, 'No iSCSI targets. The vdisk wizard presents a vdisk on one.')];
  return list.map((t) => h('section', { 'data-target': t.iqn },
    h('h2', {}, t.iqn),
    h('p', {}, t.allow_any_initiator ? 'Admits any initiator.' : `ACL: ${t.acl.join(', ') || 'nobody'}.`,
      t.chap ? ` CHAP user ${t.chap.user}${t.chap.mutual_user ? `, mutual ${t.chap.mutual_user}` : ''}.` : ' No CHAP.'),
    h('table', {},
      h('tr', {}, h('th', {}, 'LUN'), h('th', {}, 'Vdisk'), h('th', {}, 'Online'), h('th', { class: 'num' }, 'Size')),
      t.luns.map((l) => h('tr', {}, h('td', {}, l.lun), h('td', {}, l.vdisk), h('td', {}, l.online ? 'yes' : 'no'), h('td', { class: 'num' }, size(l.size))))),
    h('h3', {}, `Sessions (${t.sessions.length})`),
    t.sessions.length
      ? h('table', {}, h('tr', {}, h('th', {}, 'Initiator'), h('th', {}, 'TSIH')), t.sessions.map((s) => h('tr', {}, h('td', {}, s.initiator), h('td', {}, s.tsih))))
      : h('p', { class: 'muted' }, 'none logged in')));
}

async function nbd() {
  const list = await get('/api/nbd/exports');
  if (!list.length) return [h('p', { class: 'muted' }, 'No NBD exports. The vdisk wizard exports a vdisk.')];
  return [h('section', {}, h('table', {},
    h('tr', {}, h('th', {}, 'Export'), h('th', {}, 'Vdisk'), h('th', {}, 'Access'), h('th', {}, 'Online'), h('th', { class: 'num' }, 'Size'), h('th', { class: 'num' }, 'Connections')),
    list.map((e) => h('tr', {}, h('td', {}, e.name), h('td', {}, e.vdisk), h('td', {}, e.read_only ? 'read-only' : 'read-write'),
      h('td', {}, e.online ? 'yes' : 'no'), h('td', { class: 'num' }, size(e.size)), h('td', { class: 'num' }, e.connections)))))];
}

async function jobs() {
  const list = (await get('/api/jobs')).slice().reverse();
  if (!list.length) return [h('p', { class: 'muted' }, 'No jobs since the daemon started.')];
  return [h('section', {}, h('table', { id: 'job-table' },
    h('tr', {}, h('th', {}, 'Job'), h('th', {}, 'Kind'), h('th', {}, 'Target'), h('th', {}, 'State'), h('th', {}, 'Progress'),
      h('th', { class: 'num' }, 'Rate'), h('th', { class: 'num' }, 'ETA'), h('th', {}, 'Result'), h('th', {}, '')),
    list.map((j) => h('tr', { 'data-job': j.id, 'data-kind': j.kind, 'data-state': j.state },
      h('td', {}, j.id), h('td', {}, j.kind), h('td', {}, j.target), h('td', {}, badge(j.state)),
      h('td', {}, bar(j.done_bytes, j.total_bytes), `${size(j.done_bytes)} of ${size(j.total_bytes)}`),
      h('td', { class: 'num' }, rate(j.rate)), h('td', { class: 'num' }, j.eta_seconds ? `${j.eta_seconds.toFixed(0)} s` : '-'),
      h('td', {}, j.error || ''),
      h('td', {}, j.state === 'running'
        ? h('button', { class: 'danger', onclick: () => act(`job ${j.id}: cancel requested`, () => api('POST', `/api/jobs/${j.id}/cancel`)) }, 'Cancel')
        : '')))))];
}

function lag(r) {
  const secs = r.lag_seconds;
  const text = secs < 120 ? `${secs.toFixed(0)} s` : secs < 7200 ? `${(secs / 60).toFixed(0)} min` : `${(secs / 3600).toFixed(1)} h`;
  return r.rpo_exceeded ? h('span', { class: 'badge failed', title: `beyond the RPO of ${r.rpo_secs} s` }, text) : text;
}

function linkReport(c) {
  if (!c) return '-';
  const rtt = c.link.rtt_ms.toFixed(c.link.rtt_ms < 10 ? 1 : 0);
  const streams = c.streams.length > 1 ? `, ${c.streams.length} streams` : '';
  return `${rate(c.link.goodput)}, RTT ${rtt} ms, ${c.link.retransmit_percent.toFixed(2)} % retransmitted${streams}`;
}

async function replication() {
  const l = await get('/api/replicas');
  const out = [h('p', { class: 'muted' }, l.listen
    ? `Taking replicas from peers that hold the key, on ${l.listen}.`
    : 'Not taking replicas from peers (replication_listen is off).')];
  out.push(h('section', { id: 'replicas-out' }, h('h2', {}, 'Replicas of vdisks here'),
    l.outgoing.length
      ? h('table', {},
        h('tr', {}, h('th', {}, 'Replica'), h('th', {}, 'Source'), h('th', {}, 'To'), h('th', {}, 'State'), h('th', { class: 'num' }, 'Lag'),
          h('th', {}, 'Last snapshot'), h('th', {}, 'Last cycle'), h('th', { class: 'num' }, 'On the wire'), h('th', { class: 'num' }, 'Saved'), h('th', {}, '')),
        l.outgoing.map((r) => h('tr', { 'data-replica': r.name, 'data-state': r.state },
          h('td', {}, r.name, r.group ? ` (group ${r.group})` : ''), h('td', {}, `${r.pool}/${r.vdisk}`),
          h('td', {}, `${r.target_pool}/${r.target_vdisk} at ${r.to}`),
          h('td', { title: r.last_error || '' }, badge(r.state)), h('td', { class: 'num' }, lag(r)),
          h('td', {}, r.last_snapshot || '-'), h('td', {}, linkReport(r.last_cycle)),
          h('td', { class: 'num' }, size(r.wire_bytes)), h('td', { class: 'num' }, size(r.saved_bytes)),
          h('td', {},
            h('button', { class: 'sync', disabled: r.paused || r.state === 'syncing' || r.state === 'paused',
              onclick: () => act(`replica ${r.name}: cycle started`, () => api('POST', `/api/replicas/${enc(r.name)}/sync`)) }, 'Sync now'),
            r.state === 'paused'
              ? h('button', { class: 'resume', onclick: () => act(`replica ${r.name} resumed`, () => api('PUT', `/api/replicas/${enc(r.name)}`, { paused: false })) }, 'Resume')
              : h('button', { class: 'pause', onclick: () => act(`replica ${r.name} paused`, () => api('PUT', `/api/replicas/${enc(r.name)}`, { paused: true })) }, 'Pause')))))
      : h('p', { class: 'muted' }, 'No vdisk here is replicated: tessera replica create POOL/VDISK --to HOST:PORT --target-pool P.')));
  out.push(h('section', { id: 'replicas-in' }, h('h2', {}, 'Replicas held here for peers'),
    l.incoming.length
      ? h('table', {},
        h('tr', {}, h('th', {}, 'Replica'), h('th', {}, 'From'), h('th', {}, 'Last snapshot'), h('th', {}, 'Last cycle'), h('th', {}, 'State'), h('th', {}, '')),
        l.incoming.map((i) => h('tr', { 'data-incoming': `${i.pool}/${i.vdisk}` },
          h('td', {}, `${i.pool}/${i.vdisk}`), h('td', {}, i.source), h('td', {}, i.last_snapshot || '-'), h('td', {}, when(i.last_cycle_at)),
          h('td', {}, badge(i.receiving ? 'receiving' : 'read-only')),
          h('td', {}, h('button', { class: 'danger promote', onclick: () => confirmPromote(i) }, 'Promote')))))
      : h('p', { class: 'muted' }, 'No replicas are held here.')));
  return out;
}

function confirmPromote(i) {
  dialog('Promote a replica', [h('p', {},
    `Promote ${i.pool}/${i.vdisk}? It becomes a writable vdisk at its last consistent snapshot (${i.last_snapshot || 'none yet'}), `
    + `and cycles from ${i.source} are refused from then on. To fail back, demote the replica at the old source and reverse it from here.`)],
  async () => {
    const p = await api('POST', `/api/pools/${enc(i.pool)}/replicas/${enc(i.vdisk)}/promote`);
    return `${p.pool}/${p.vdisk} promoted at ${p.snapshot}`;
  }, 'Promote it');
}

function eventTable(events) {
  if (!events.length) return h('p', { class: 'muted' }, 'No events yet.');
  return h('table', { class: 'events' },
    h('tr', {}, h('th', {}, '#'), h('th', {}, 'When'), h('th', {}, 'Severity'), h('th', {}, 'Kind'), h('th', {}, 'What')),
    events.map(eventRow));
}

function eventRow(e) {
  return h('tr', { 'data-kind': e.kind },
    h('td', {}, e.seq), h('td', {}, when(e.time)), h('td', {}, badge(e.severity)), h('td', {}, e.kind),
    h('td', {}, e.message, e.repeats ? ` (and ${e.repeats} like it)` : ''));
}

// The events page follows the stream instead of polling.
let stream = null;
async function events() {
  const list = await get('/api/events?limit=200');
  // Left while the list was on its way: no stream for a page no longer shown.
  if (page() !== 'events') return [];
  const holder = h('section', { id: 'event-list' }, eventTable(list.events.slice().reverse()));
  if (stream) stream.close();
  const after = list.events.length ? list.events[list.events.length - 1].seq : list.next_seq - 1;
  stream = new EventSource(`/api/events/stream?after=${after}&key=${enc(sessionKey())}`);
  stream.onmessage = (m) => {
    const e = JSON.parse(m.data);
    const t = holder.querySelector('table');
    if (t) t.rows[0].after(eventRow(e));
    else holder.replaceChildren(eventTable([e]));
  };
  return [h('p', { class: 'muted' }, 'Live: new events appear at the top as they happen.'), holder];
}

// ---- wizards ----

function dialog(title, fields, submit, label) {
  const err = h('div', { class: 'error', id: 'wizard-error' });
  const form = h('form', { class: 'wizard', id: 'wizard' }, h('h3', {}, title), ...fields, err,
    h('div', { class: 'buttons' },
      h('button', { type: 'button', onclick: closeDialog }, 'Cancel'),
      h('button', { type: 'submit', class: 'primary', id: 'wizard-submit' }, label || 'Create')));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    err.textContent = '';
    const button = form.querySelector('#wizard-submit');
    button.disabled = true;
    try {
      const done = await submit(form);
      closeDialog();
      notice(done, true);
      refresh();
    } catch (e) {
      err.textContent = e.message;
    } finally {
      button.disabled = false;
    }
  });
  document.getElementById('dialog').replaceChildren(form);
  document.getElementById('modal').hidden = false;
  const first = form.querySelector('input, select, textarea');
  if (first) first.focus();
}

function closeDialog() {
  document.getElementById('modal').hidden = true;
  document.getElementById('dialog').replaceChildren();
}

function field(label, input, hint) {
  return h('div', {}, h('label', { for: input.id }, label, hint ? h('span', { class: 'hint' }, ` ${hint}`) : ''), input);
}

function lines(text) { return text.split('\n').map((s) => s.trim()).filter(Boolean); }

function poolWizard() {
  dialog('Create a pool', [
    field('Name', h('input', { type: 'text', id: 'pool-name', required: true, pattern: '[A-Za-z0-9._-]+' })),
    field('Disks', h('textarea', { id: 'pool-disks', rows: 4, required: true }), 'one path per line: blank block devices or files'),
    field('Cache disks', h('textarea', { id: 'pool-cache-disks', rows: 2 }), 'optional, fast disks for the write-back cache log: give two'),
  ], async (f) => {
    const name = f.querySelector('#pool-name').value.trim();
    await api('POST', '/api/pools', {
      name,
      disks: lines(f.querySelector('#pool-disks').value),
      cache_disks: lines(f.querySelector('#pool-cache-disks').value),
    });
    return `pool ${name} created`;
  });
}

const UNITS = { MiB: 2 ** 20, GiB: 2 ** 30, TiB: 2 ** 40 };

async function vdiskWizard() {
  const pools = (await get('/api/pools')).filter((p) => p.health !== 'unavailable' && p.health !== 'destroying');
  if (!pools.length) { notice('create a pool first'); return; }
  const layout = h('select', { id: 'vdisk-layout' },
    h('option', { value: 'mirror' }, 'Mirror: copies on different disks (survives 1 failure, 2 with 3 copies)'),
    h('option', { value: 'parity' }, 'Parity: one column of parity (survives 1 failure)'),
    h('option', { value: 'dual-parity' }, 'Dual parity: two columns of parity (survives 2 failures)'),
    h('option', { value: 'simple' }, 'Simple: no redundancy (a failed disk loses data)'));
  const copies = h('select', { id: 'vdisk-copies' }, h('option', { value: '2' }, '2-way'), h('option', { value: '3' }, '3-way'));
  const present = h('select', { id: 'vdisk-present' },
    h('option', { value: 'none' }, 'Not now'), h('option', { value: 'iscsi' }, 'Over iSCSI'), h('option', { value: 'nbd' }, 'Over NBD'));
  const name = h('input', { type: 'text', id: 'vdisk-name', required: true, pattern: '[A-Za-z0-9._-]+' });
  const iqn = h('input', { type: 'text', id: 'vdisk-iqn' });
  name.addEventListener('input', () => { iqn.placeholder = `iqn.2026-11.io.tessera:${name.value}`; });
  const initiator = h('input', { type: 'text', id: 'vdisk-initiator' });
  const anyInitiator = h('input', { type: 'checkbox', id: 'vdisk-any-initiator' });
  const iscsiFields = h('div', { id: 'iscsi-fields', hidden: true },
    field('Target', iqn, 'IQN; made if it does not exist'),
    field('Initiator allowed', initiator, 'its IQN, added to the target\'s ACL'),
    h('label', {}, anyInitiator, ' admit any initiator (test setups only)'));
  present.addEventListener('change', () => { iscsiFields.hidden = present.value !== 'iscsi'; });
  layout.addEventListener('change', () => { copies.disabled = layout.value !== 'mirror'; });
  dialog('Create a vdisk', [
    field('Pool', h('select', { id: 'vdisk-pool' }, pools.map((p) => h('option', { value: p.name }, `${p.name} (${p.health}, ${size(p.capacity ? p.capacity.free_bytes : 0)} free)`)))),
    field('Name', name),
    h('div', { class: 'row' },
      field('Size', h('input', { type: 'number', id: 'vdisk-size', min: 1, step: 'any', required: true, value: '1' })),
      field('Unit', h('select', { id: 'vdisk-unit' }, Object.keys(UNITS).map((u) => h('option', { value: u, selected: u === 'GiB' }, u))))),
    field('Resiliency', layout),
    h('div', { class: 'row' },
      field('Mirror copies', copies),
      field('Provisioning', h('select', { id: 'vdisk-provisioning' },
        h('option', { value: 'thin' }, 'Thin: space taken as it is written'),
        h('option', { value: 'fixed' }, 'Fixed: all space reserved now')))),
    field('Present it', present),
    iscsiFields,
  ], async (f) => {
    const pool = f.querySelector('#vdisk-pool').value;
    const vname = name.value.trim();
    const bytes = Math.round(parseFloat(f.querySelector('#vdisk-size').value) * UNITS[f.querySelector('#vdisk-unit').value] / 4096) * 4096;
    const body = { name: vname, size: bytes, layout: layout.value, provisioning: f.querySelector('#vdisk-provisioning').value };
    if (layout.value === 'mirror') body.copies = parseInt(copies.value, 10);
    await api('POST', `/api/pools/${enc(pool)}/vdisks`, body);
    const full = `${pool}/${vname}`;
    if (present.value === 'nbd') {
      const e = await api('POST', '/api/nbd/exports', { vdisk: full });
      return `vdisk ${full} created and exported over NBD as ${e.name}`;
    }
    if (present.value === 'iscsi') {
      const target = iqn.value.trim() || iqn.placeholder;
      const existing = (await get('/api/targets')).find((t) => t.iqn === target);
      if (!existing) await api('POST', '/api/targets', { iqn: target, allow_any_initiator: anyInitiator.checked });
      else if (anyInitiator.checked && !existing.allow_any_initiator) {
        await api('PUT', `/api/targets/${enc(target)}/allow-any-initiator`, { allow: true });
      }
      if (initiator.value.trim()) await api('POST', `/api/targets/${enc(target)}/acl`, { initiator: initiator.value.trim() });
      const t = await api('POST', `/api/targets/${enc(target)}/luns`, { vdisk: full });
      const lun = t.luns.find((l) => l.vdisk === full);
      return `vdisk ${full} created and presented as LUN ${lun ? lun.lun : '?'} of ${target}`;
    }
    return `vdisk ${full} created`;
  });
}

function snapshotWizard(v) {
  const stamp = new Date().toISOString().replace(/[-:]/g, '').replace('T', '-').slice(0, 15);
  dialog(`Snapshot of ${v.pool}/${v.name}`, [
    field('Name', h('input', { type: 'text', id: 'snapshot-name', required: true, value: `snap-${stamp}`, pattern: '[A-Za-z0-9._-]+' })),
  ], async (f) => {
    const s = f.querySelector('#snapshot-name').value.trim();
    await api('POST', `/api/pools/${enc(v.pool)}/vdisks/${enc(v.name)}/snapshots`, { name: s });
    return `snapshot ${v.pool}/${v.name}@${s} taken`;
  }, 'Take it');
}

// ---- routing and refresh ----

const PAGES = { overview, pools, vdisks, targets, nbd, replication, jobs, events };
let timer = null;
let rendering = false;

function page() {
  const p = location.hash.slice(1);
  return Object.hasOwn(PAGES, p) ? p : 'overview';
}

async function refresh() {
  if (rendering) return;
  rendering = true;
  const name = page();
  try {
    const content = await PAGES[name]();
    if (name === page()) {
      document.getElementById('main').replaceChildren(h('h2', {}, document.getElementById(`nav-${name}`).textContent), ...content);
      document.body.dataset.page = name;
    }
  } catch (e) {
    if (e.message !== 'logged out') notice(e.message);
  } finally {
    rendering = false;
  }
}

function route() {
  for (const a of document.querySelectorAll('header nav a')) a.classList.toggle('current', a.id === `nav-${page()}`);
  if (stream && page() !== 'events') { stream.close(); stream = null; }
  clearInterval(timer);
  refresh();
  // The events page is live through its stream; the others are read again every 2 s.
  if (page() !== 'events') timer = setInterval(refresh, REFRESH_MS);
}

document.getElementById('modal').addEventListener('click', (e) => { if (e.target.id === 'modal') closeDialog(); });
document.getElementById('logout').addEventListener('click', () => localStorage.removeItem('tessera-key'));
window.addEventListener('hashchange', route);
route();
