// scalemb interactive map.  Points are drawn with WebGL by regl-scatterplot (vendored, inlined before this script as
// window.createScatterplot), or by the canvas-2-D scatter below where WebGL is a software rasteriser and the map is
// large; edges of the visible region, community and node labels and the found-node ring are drawn on a 2-D canvas
// above it.  The data come from the page's <script id="map-data" type="application/json">:
// typed arrays base64-encoded, little-endian.
"use strict";
(function () {
  const meta = JSON.parse(document.getElementById("map-data").textContent);
  const TYPES = {f32: Float32Array, f64: Float64Array, i32: Int32Array, u32: Uint32Array, u16: Uint16Array,
                 u8: Uint8Array};
  function decode(entry) {
    if (!entry) return null;
    const bin = atob(entry.b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return new TYPES[entry.dtype](bytes.buffer);
  }
  const n = meta.n;
  const X = decode(meta.x), Y = decode(meta.y), ids = meta.id_names || decode(meta.ids);
  const values = {};
  for (const key of Object.keys(meta.values)) values[key] = decode(meta.values[key]);
  const edges = decode(meta.edges);
  const classes = decode(meta.classes), classNames = meta.class_names || [];
  const component = decode(meta.component);
  const community = decode(meta.community), communities = meta.communities || null;
  const $ = id => document.getElementById(id);
  const canvas = $("map"), overlay = $("overlay"), octx = overlay.getContext("2d");
  const tip = $("tip"), info = $("info"), legend = $("legend");

  // ---- data -> normalised device coordinates ([-1, 1] on the longer side of the data's bounding box)
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (let i = 0; i < n; i++) {
    x0 = Math.min(x0, X[i]); x1 = Math.max(x1, X[i]); y0 = Math.min(y0, Y[i]); y1 = Math.max(y1, Y[i]);
  }
  if (n === 0) { x0 = y0 = -1; x1 = y1 = 1; }
  const c0 = (x0 + x1) / 2, c1 = (y0 + y1) / 2, half = Math.max((x1 - x0) / 2, (y1 - y0) / 2, 1e-12);
  const NX = new Float32Array(n), NY = new Float32Array(n);
  for (let i = 0; i < n; i++) { NX[i] = (X[i] - c0) / half; NY[i] = (Y[i] - c1) / half; }

  // ---- colour keys: a palette index per point (regl-scatterplot's categorical valueA), palette and legend
  const hex = c => "#" + c.map(v => Math.round(v).toString(16).padStart(2, "0")).join("");
  function ramp(stops, t) {
    t = Math.min(1, Math.max(0, t)) * (stops.length - 1);
    const k = Math.min(stops.length - 2, Math.floor(t)), f = t - k, a = stops[k], b = stops[k + 1];
    return [a[0] + f * (b[0] - a[0]), a[1] + f * (b[1] - a[1]), a[2] + f * (b[2] - a[2])];
  }
  const RDBU = [[33, 102, 172], [103, 169, 207], [209, 229, 240], [220, 220, 220], [253, 219, 199],
                [239, 138, 98], [178, 24, 43]];
  const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  const TAB = meta.palette;  // categorical colours: community k is TAB[k % TAB.length], as in scalemb plot
  const BINS = 64;
  const continuousPalette = stops => Array.from({length: BINS}, (_, k) => hex(ramp(stops, k / (BINS - 1))));
  function continuous(v, lo, hi, transform) {
    const index = new Float32Array(n), span = Math.max(hi - lo, 1e-12);
    for (let i = 0; i < n; i++) {
      const t = (transform(v[i]) - lo) / span;
      index[i] = Number.isFinite(t) ? Math.round(Math.min(1, Math.max(0, t)) * (BINS - 1)) : 0;
    }
    return index;
  }
  function categorical(codes, count) {
    const index = new Float32Array(n);
    for (let i = 0; i < n; i++) index[i] = codes[i] % TAB.length;
    return {index, palette: TAB.slice(0, Math.max(1, Math.min(count, TAB.length))).map(hex)};
  }
  const keys = {};
  function colourKey(name) {
    if (keys[name]) return keys[name];
    let key;
    if (name === "none") {
      key = {index: new Float32Array(n), palette: [hex(TAB[0])], legend: null};
    } else if (name === "label") {
      key = categorical(classes, classNames.length);
      key.legend = {title: "label", items: classNames.slice(0, 20).map((c, k) => [hex(TAB[k % TAB.length]), c]),
                    more: Math.max(0, classNames.length - 20)};
    } else if (name === "community") {
      key = categorical(community, communities.names.length);
      key.legend = {title: `community (${communities.names.length}, ${communities.method})`,
                    items: communities.names.slice(0, 12).map((c, k) =>
                      [hex(TAB[k % TAB.length]), `${c} (${communities.sizes[k]})`]),
                    more: Math.max(0, communities.names.length - 12)};
    } else if (name === "component") {
      const codes = new Uint32Array(n);
      for (let i = 0; i < n; i++) codes[i] = component[i] === 0 ? 0 : 7;
      key = categorical(codes, 8);
      key.legend = {title: "component", items: [[hex(TAB[0]), "largest component"], [hex(TAB[7]), "other components"]]};
    } else {
      const v = values[name];
      let lo = Infinity, hi = -Infinity;
      const diverging = name.startsWith("time"), logged = name === "degree";
      const f = logged ? (x => Math.log(Math.max(x, 1))) : (x => x);
      for (let i = 0; i < n; i++) { const t = f(v[i]); if (Number.isFinite(t)) { lo = Math.min(lo, t); hi = Math.max(hi, t); } }
      if (!Number.isFinite(lo)) { lo = 0; hi = 1; }
      if (diverging) { hi = Math.max(Math.abs(lo), Math.abs(hi), 1e-12); lo = -hi; }
      const stops = diverging ? RDBU : VIRIDIS;
      key = {index: continuous(v, lo, hi, f), palette: continuousPalette(stops)};
      const shown = x => (logged ? Math.exp(x) : x).toPrecision(3);
      key.legend = {title: name + (logged ? " (log scale)" : ""), stops: stops.map(hex), lo: shown(lo), hi: shown(hi)};
      // the extreme values on top: |time| for the diverging key, the value itself otherwise
      const weight = new Float32Array(n);
      for (let i = 0; i < n; i++) weight[i] = diverging ? Math.abs(v[i]) : (Number.isFinite(v[i]) ? v[i] : -Infinity);
      key.order = Array.from({length: n}, (_, i) => i).sort((a, b) => weight[a] - weight[b]);
    }
    keys[name] = key;
    return key;
  }
  function showLegend(key) {
    legend.replaceChildren();
    if (!key.legend || !$("legend-on").checked) return;
    const spec = key.legend, head = document.createElement("div");
    head.className = "title"; head.textContent = spec.title; legend.append(head);
    if (spec.stops) {
      const bar = document.createElement("div");
      bar.className = "bar";
      bar.style.background = `linear-gradient(to right,${spec.stops.join(",")})`;
      const ends = document.createElement("div");
      ends.className = "ends";
      for (const t of [spec.lo, spec.hi]) { const s = document.createElement("span"); s.textContent = t; ends.append(s); }
      legend.append(bar, ends);
    }
    for (const [colour, text] of spec.items || []) {
      const row = document.createElement("div"), sw = document.createElement("span");
      sw.className = "sw"; sw.style.background = colour;
      row.append(sw, document.createTextNode(text)); legend.append(row);
    }
    if (spec.more) { const m = document.createElement("div"); m.textContent = `… ${spec.more} more`; legend.append(m); }
  }

  // ---- the scatterplot and the view: data units -> CSS pixels, px = (x - cx) * scale + width / 2
  let width = 0, height = 0;
  const view = {cx: c0, cy: c1, scale: 1};
  const pointSize = n > 300000 ? 2 : n > 30000 ? 3 : n > 3000 ? 4 : 6;
  let scatter = null;
  // The renderer: WebGL (regl-scatterplot) unless the browser's WebGL is a software rasteriser (SwiftShader,
  // llvmpipe): there the canvas-2-D scatter below draws many times faster at every size measured (5e3 to 8e5
  // points).  "#renderer=webgl" or "#renderer=canvas" in the address chooses.
  function glRenderer() {
    const gl = document.createElement("canvas").getContext("webgl");
    if (!gl) return null;
    const ext = gl.getExtension("WEBGL_debug_renderer_info");
    const name = String(gl.getParameter(ext ? ext.UNMASKED_RENDERER_WEBGL : gl.RENDERER));
    const lose = gl.getExtension("WEBGL_lose_context");
    if (lose) lose.loseContext();
    return name;
  }
  const glName = window.createScatterplot ? glRenderer() : null;
  const asked = (location.hash.match(/renderer=(webgl|canvas)/) || [])[1];
  const software = glName !== null && /swiftshader|llvmpipe|software/i.test(glName);
  const renderer = glName === null ? "canvas" : asked || (software ? "canvas" : "webgl");
  function measure() {
    const r = canvas.getBoundingClientRect();
    width = Math.max(1, Math.round(r.width)); height = Math.max(1, Math.round(r.height));
    const dpr = window.devicePixelRatio || 1;
    overlay.width = Math.round(width * dpr); overlay.height = Math.round(height * dpr);
    octx.setTransform(dpr, 0, 0, dpr, 0, 0);
  }
  measure();
  const options = {canvas, width, height, pointSize, backgroundColor: [1, 1, 1, 1], pointColorHover: [0, 0, 0, 1],
                   pointColorActive: [0.84, 0.15, 0.16, 1], pointSizeSelected: 1, pointOutlineWidth: 1,
                   lassoColor: [0.84, 0.15, 0.16, 1], lassoMinDelay: 0, lassoMinDist: 2, opacity: 1,
                   pointScaleMode: "constant", deselectOnDblClick: true, deselectOnEscape: true};
  scatter = renderer === "webgl" ? window.createScatterplot(options) : canvasScatter(options);

  // A canvas-2-D scatter with the part of regl-scatterplot's interface this page uses (camera view matrix, draw,
  // set, subscribe, select, lasso / box, hover): points written into an ImageData buffer, one 32-bit store per
  // pixel, a uniform grid for hover.
  function canvasScatter(o) {
    const ctx = canvas.getContext("2d"), handlers = {}, m = {s: 1, tx: 0, ty: 0};
    let W = o.width, H = o.height, size = o.pointSize, colours = null, order = null, sel = [], selSet = new Set();
    let mode = "panZoom", lassoType = "freeform", image = null, pixels = null, pending = false, px = null, py = null;
    let hovered = -1, drag = null, lasso = null;
    const emit = (name, payload) => (handlers[name] || []).forEach(f => f(payload));
    const matrix = () => [m.s, 0, 0, 0, 0, m.s, 0, 0, 0, 0, 1, 0, m.tx, m.ty, 0, 1];
    function resize() {
      const dpr = window.devicePixelRatio || 1;
      canvas.width = Math.round(W * dpr); canvas.height = Math.round(H * dpr);
      image = ctx.createImageData(canvas.width, canvas.height); pixels = new Uint32Array(image.data.buffer);
    }
    resize();
    function project() {  // screen positions (CSS px) of every point under the current view
      px = px || new Float32Array(n); py = py || new Float32Array(n);
      const a = m.s * H / 2, bx = W / 2 + m.tx * H / 2, by = H / 2 - m.ty * H / 2;
      for (let i = 0; i < n; i++) { px[i] = a * NX[i] + bx; py[i] = by - a * NY[i]; }
    }
    function request() { if (!pending) { pending = true; requestAnimationFrame(frame); } }
    function frame() {
      pending = false;
      if (!colours) return;
      const dpr = window.devicePixelRatio || 1, CW = canvas.width, CH = canvas.height;
      project();
      pixels.fill(0xffffffff);
      const side = Math.max(1, Math.round(size * dpr * 0.8)), half = side >> 1;
      const put = (i, c, s) => {
        const x = Math.floor(px[i] * dpr) - (s >> 1), y = Math.floor(py[i] * dpr) - (s >> 1);
        if (x <= -s || y <= -s || x >= CW || y >= CH) return;
        const u1 = Math.min(CW, x + s), v1 = Math.min(CH, y + s), u0 = Math.max(0, x);
        for (let v = Math.max(0, y); v < v1; v++) { const row = v * CW; for (let u = u0; u < u1; u++) pixels[row + u] = c; }
      };
      if (side === 1) {
        for (let k = 0; k < n; k++) {
          const i = order ? order[k] : k, x = Math.floor(px[i] * dpr), y = Math.floor(py[i] * dpr);
          if (x >= 0 && y >= 0 && x < CW && y < CH) pixels[y * CW + x] = colours[i];
        }
      } else {
        for (let k = 0; k < n; k++) { const i = order ? order[k] : k; put(i, colours[i], side); }
      }
      const red = (255 << 24 | 39 << 16 | 39 << 8 | 214) >>> 0;
      for (const i of sel) put(i, red, side + 2);
      if (hovered >= 0) put(hovered, 0xff000000, side + 4);
      ctx.putImageData(image, 0, 0);
      if (lasso && lasso.length > 1) {
        ctx.save(); ctx.scale(dpr, dpr); ctx.strokeStyle = "rgb(214,39,39)"; ctx.lineWidth = 2; ctx.beginPath();
        lasso.forEach(([x, y], k) => (k ? ctx.lineTo(x, y) : ctx.moveTo(x, y))); ctx.closePath(); ctx.stroke();
        ctx.restore();
      }
      void half;
      emit("draw", {view: matrix()});
    }
    function changed() { emit("view", {view: matrix()}); request(); }
    // hover: a uniform grid over the normalised positions
    const G = Math.max(1, Math.min(1024, Math.round(Math.sqrt(n / 4))));
    const start = new Uint32Array(G * G + 1), items = new Uint32Array(n), cell = new Uint32Array(n);
    const gi = v => Math.min(G - 1, Math.max(0, Math.floor((v + 1) / 2 * G)));
    for (let i = 0; i < n; i++) { cell[i] = gi(NY[i]) * G + gi(NX[i]); start[cell[i] + 1]++; }
    for (let c = 0; c < G * G; c++) start[c + 1] += start[c];
    const fill = start.slice(0, G * G);
    for (let i = 0; i < n; i++) items[fill[cell[i]]++] = i;
    function nearest(sx, sy, radius) {
      const a = m.s * H / 2, nx = (sx - W / 2 - m.tx * H / 2) / a, ny = (H / 2 - m.ty * H / 2 - sy) / a, r = radius / a;
      const g0 = gi(nx - r), g1 = gi(nx + r), h0 = gi(ny - r), h1 = gi(ny + r);
      if ((g1 - g0 + 1) * (h1 - h0 + 1) > 4096) return -1;
      let best = -1, bestD = r * r;
      for (let gy = h0; gy <= h1; gy++) for (let gx = g0; gx <= g1; gx++) {
        const c = gy * G + gx;
        for (let k = start[c]; k < start[c + 1]; k++) {
          const i = items[k], ex = NX[i] - nx, ey = NY[i] - ny, d = ex * ex + ey * ey;
          if (d <= bestD) { bestD = d; best = i; }
        }
      }
      return best;
    }
    function select(indices, {preventEvent = false} = {}) {
      sel = Array.from(indices); selSet = new Set(sel); request();
      if (!preventEvent) emit(sel.length ? "select" : "deselect", sel.length ? {points: sel} : undefined);
    }
    function inside(poly) {  // points whose screen position lies inside the polygon (even-odd rule)
      project();
      let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
      for (const [x, y] of poly) { x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y); }
      const out = [];
      for (let i = 0; i < n; i++) {
        const x = px[i], y = py[i];
        if (x < x0 || x > x1 || y < y0 || y > y1) continue;
        let c = false;
        for (let a = 0, b = poly.length - 1; a < poly.length; b = a++) {
          const [ax, ay] = poly[a], [bx, by] = poly[b];
          if ((ay > y) !== (by > y) && x < (bx - ax) * (y - ay) / (by - ay) + ax) c = !c;
        }
        if (c) out.push(i);
      }
      return out;
    }
    const local = e => { const r = canvas.getBoundingClientRect(); return [e.clientX - r.left, e.clientY - r.top]; };
    canvas.addEventListener("pointerdown", e => {
      if (e.pointerType === "touch") return;
      canvas.setPointerCapture(e.pointerId);
      const at = local(e);
      if (mode === "lasso" || e.shiftKey) lasso = [at];
      else drag = {at, tx: m.tx, ty: m.ty};
    });
    canvas.addEventListener("pointermove", e => {
      if (e.pointerType === "touch") return;
      const at = local(e);
      if (lasso) {
        lasso = lassoType === "rectangle" && mode === "lasso"
          ? [lasso[0], [at[0], lasso[0][1]], at, [lasso[0][0], at[1]]] : lasso.concat([at]);
        request(); return;
      }
      if (drag) {
        m.tx = drag.tx + 2 * (at[0] - drag.at[0]) / H; m.ty = drag.ty - 2 * (at[1] - drag.at[1]) / H;
        changed(); return;
      }
      const i = nearest(at[0], at[1], Math.max(4, size));
      if (i !== hovered) {
        if (hovered >= 0) emit("pointOut", hovered);
        hovered = i; request();
        if (i >= 0) emit("pointOver", i);
      }
    });
    canvas.addEventListener("pointerup", () => {
      if (lasso && lasso.length > 2) select(inside(lasso));
      lasso = null; drag = null; request();
    });
    canvas.addEventListener("dblclick", () => select([]));
    document.addEventListener("keydown", e => { if (e.key === "Escape") select([]); });
    canvas.addEventListener("wheel", e => {
      e.preventDefault();
      const [sx, sy] = local(e), f = Math.exp(-e.deltaY * (e.deltaMode === 1 ? 0.05 : 0.0015));
      const ax = 2 * (sx - W / 2) / H, ay = -2 * (sy - H / 2) / H;  // the cursor in the view's units
      m.s *= f; m.tx = ax - (ax - m.tx) * f; m.ty = ay - (ay - m.ty) * f;
      changed();
    }, {passive: false});
    return {
      set(props) {
        if ("width" in props || "height" in props) { W = props.width || W; H = props.height || H; resize(); }
        if ("pointSize" in props) size = props.pointSize;
        if ("mouseMode" in props) mode = props.mouseMode;
        if ("lassoType" in props) lassoType = props.lassoType;
        if ("pointOrder" in props) order = props.pointOrder;
        if ("pointColor" in props) this.palette = props.pointColor.map(h => {
          const v = parseInt(h.slice(1), 16);
          return (255 << 24 | (v & 255) << 16 | ((v >> 8) & 255) << 8 | (v >> 16)) >>> 0;
        });
        request();
      },
      async draw(points) {
        colours = new Uint32Array(n);
        for (let i = 0; i < n; i++) colours[i] = this.palette[points.z[i]];
        request();
        await new Promise(ok => { const f = () => (pending ? requestAnimationFrame(f) : ok()); requestAnimationFrame(f); });
      },
      get(name) {
        if (name === "cameraView") return matrix();
        if (name === "pointsInView") {
          project();
          const out = [];
          for (let i = 0; i < n; i++) if (px[i] >= 0 && px[i] <= W && py[i] >= 0 && py[i] <= H) out.push(i);
          return out;
        }
        return undefined;
      },
      zoomToLocation([x, y], distance) { m.s = 1 / distance; m.tx = -x / distance; m.ty = -y / distance; changed(); },
      subscribe(name, f) { (handlers[name] = handlers[name] || []).push(f); },
      select, deselect: () => select([]),
    };
  }
  // point size: pointSize in the first view, growing with the square root of the zoom from there (at most 4x)
  let shownSize = pointSize;
  function sizePoints() {
    const size = Math.round(2 * pointSize * Math.min(4, Math.max(1, Math.sqrt(view.scale / home.scale)))) / 2;
    if (scatter && size !== shownSize) { shownSize = size; scatter.set({pointSize: size}); }
  }
  function syncView(matrix) {  // the camera's view matrix: scale m[0] (= m[5]) and translation m[12], m[13]
    view.scale = matrix[0] * height / (2 * half);
    view.cx = c0 - matrix[12] * half / matrix[0];
    view.cy = c1 - matrix[13] * half / matrix[5];
    sizePoints();
  }
  function setView(cx, cy, scale) {  // the inverse of syncView: camera target (NDC) and distance
    const distance = height / (2 * half * scale);
    if (scatter) scatter.zoomToLocation([(cx - c0) / half, (cy - c1) / half], distance);
    view.cx = cx; view.cy = cy; view.scale = scale;
    schedule();
  }
  function fit(b) {
    const s = Math.min(width / Math.max(b[1] - b[0], 1e-12), height / Math.max(b[3] - b[2], 1e-12));
    setView((b[0] + b[1]) / 2, (b[2] + b[3]) / 2, s);
  }
  const toScreen = (x, y) => [(x - view.cx) * view.scale + width / 2, height / 2 - (y - view.cy) * view.scale];
  const toData = (px, py) => [(px - width / 2) / view.scale + view.cx, (height / 2 - py) / view.scale + view.cy];

  // ---- overlay: edges of the visible region (level of detail), labels that never overlap, the found node
  const EDGE_BUDGET = 40000;  // drawn per frame; more visible edges are drawn with a stride
  let found = -1, pendingOverlay = false, placed = [];
  function schedule() { if (!pendingOverlay) { pendingOverlay = true; requestAnimationFrame(drawOverlay); } }
  function visibleEdges() {
    const [ax, ay] = toData(0, height), [bx, by] = toData(width, 0), m = edges ? edges.length / 2 : 0;
    const inside = i => X[i] >= ax && X[i] <= bx && Y[i] >= ay && Y[i] <= by;
    let count = 0;
    for (let e = 0; e < 2 * m; e += 2) if (inside(edges[e]) || inside(edges[e + 1])) count++;
    return {count, stride: Math.max(1, Math.ceil(count / EDGE_BUDGET)), inside};
  }
  function drawEdges() {
    const {count, stride, inside} = visibleEdges();
    if (!count) return 0;
    const alpha = Math.min(0.5, Math.max(0.05, 20 / Math.sqrt(count / stride)));
    octx.strokeStyle = `rgba(60,60,60,${alpha})`; octx.lineWidth = 0.6; octx.beginPath();
    let k = 0, drawn = 0;
    for (let e = 0; e < edges.length; e += 2) {
      const a = edges[e], b = edges[e + 1];
      if (!(inside(a) || inside(b)) || (k++ % stride)) continue;
      const [pa, qa] = toScreen(X[a], Y[a]), [pb, qb] = toScreen(X[b], Y[b]);
      octx.moveTo(pa, qa); octx.lineTo(pb, qb); drawn++;
    }
    octx.stroke();
    return drawn;
  }
  // The greedy placer: candidates in priority order; each takes the first of its positions (centred, then around
  // its anchor) whose box overlaps neither a placed label nor the canvas edge, or is left out.
  function placeLabels(candidates) {
    const boxes = [];
    for (const c of candidates) {
      const w = c.w + 6, h = c.h + 2, [px, py] = c.at;
      const spots = c.centred ? [[px - w / 2, py - h / 2], [px - w / 2, py - h - 4], [px - w / 2, py + 4]]
                              : [[px + 4, py - h - 2], [px + 4, py + 2], [px - w - 4, py - h - 2], [px - w - 4, py + 2]];
      for (const [bx, by] of spots) {
        if (bx < 0 || by < 0 || bx + w > width || by + h > height) continue;
        if (boxes.some(o => bx < o.x + o.w && o.x < bx + w && by < o.y + o.h && o.y < by + h)) continue;
        boxes.push({x: bx, y: by, w, h, text: c.text, kind: c.kind, index: c.index});
        break;
      }
    }
    return boxes;
  }
  const textWidth = {};
  function measureText(text, font) {
    const k = font + "|" + text;
    if (!(k in textWidth)) { octx.font = font; textWidth[k] = octx.measureText(text).width; }
    return textWidth[k];
  }
  const COMMUNITY_FONT = "600 12px system-ui,sans-serif", NODE_FONT = "11px system-ui,sans-serif";
  function labelCandidates() {
    const out = [];
    if (communities && $("labels-on").checked) {
      // communities holding at least 1/2000 of the points a view of this zoom shows (3 at least), largest first,
      // at most one label per 25000 square pixels
      const zoom = view.scale / home.scale, least = Math.max(3, n / 2000 / (zoom * zoom));
      const budget = Math.max(4, Math.floor(width * height / 25000));
      for (let k = 0; k < communities.names.length && out.length < budget; k++) {
        if (communities.sizes[k] < least) break;
        const [px, py] = toScreen(communities.x[k], communities.y[k]);
        if (px < 0 || py < 0 || px > width || py > height) continue;
        const text = communities.names[k];
        out.push({at: [px, py], w: measureText(text, COMMUNITY_FONT), h: 14, text, kind: "community", index: k,
                  centred: true});
      }
    }
    // zoomed in far enough that few points are in view: the highest-degree of them named too
    const [ax, ay] = toData(0, height), [bx, by] = toData(width, 0);
    let inViewCount = 0;
    for (let i = 0; i < n && inViewCount < 3000; i++) if (X[i] >= ax && X[i] <= bx && Y[i] >= ay && Y[i] <= by) inViewCount++;
    if (scatter && $("labels-on").checked && inViewCount < 3000) {
      const inView = scatter.get("pointsInView");
      const degree = values.degree;
      const ranked = degree ? Array.from(inView).sort((a, b) => degree[b] - degree[a]) : Array.from(inView);
      for (const i of ranked.slice(0, 60)) {
        const text = String(ids[i]);
        out.push({at: toScreen(X[i], Y[i]), w: measureText(text, NODE_FONT), h: 12, text, kind: "node", index: i});
      }
    }
    return out;
  }
  // the Poincaré disk (a run in the hyperbolic ball): its boundary and geodesic grid, faint, under the labels
  function drawDisk() {
    octx.strokeStyle = "rgba(0,0,0,0.22)"; octx.lineWidth = 0.8; octx.beginPath();
    for (const line of meta.grid || []) {
      for (let k = 0; k < line.length; k += 2) {
        const [px, py] = toScreen(line[k], line[k + 1]);
        if (k) octx.lineTo(px, py); else octx.moveTo(px, py);
      }
    }
    octx.stroke();
    const [cx, cy] = toScreen(0, 0);
    octx.strokeStyle = "#000"; octx.lineWidth = 1.2; octx.beginPath();
    octx.arc(cx, cy, view.scale, 0, 2 * Math.PI); octx.stroke();
  }
  let lastEdges = 0;
  function drawOverlay() {
    pendingOverlay = false;
    octx.clearRect(0, 0, width, height);
    if (meta.disk) drawDisk();
    lastEdges = edges && $("edges").checked ? drawEdges() : 0;
    placed = placeLabels(labelCandidates());
    octx.textBaseline = "middle";
    for (const b of placed) {
      octx.font = b.kind === "community" ? COMMUNITY_FONT : NODE_FONT;
      octx.fillStyle = b.kind === "community" ? "rgba(255,255,255,0.8)" : "rgba(255,255,255,0.7)";
      octx.fillRect(b.x, b.y, b.w, b.h);
      octx.fillStyle = b.kind === "community" ? "#111" : "#333";
      octx.fillText(b.text, b.x + 3, b.y + b.h / 2 + 0.5);
    }
    if (found >= 0) {
      const [fx, fy] = toScreen(X[found], Y[found]);
      octx.strokeStyle = "#d62728"; octx.lineWidth = 2;
      octx.beginPath(); octx.arc(fx, fy, 9, 0, 2 * Math.PI); octx.stroke();
    }
    document.body.dataset.overlays = String(Number(document.body.dataset.overlays || 0) + 1);
  }

  // ---- points: (re)drawn with the colour key's palette; the spatial index is built once
  let currentKey = null, spatialIndex;
  async function colourBy(name) {
    const key = colourKey(name);
    currentKey = name;
    showLegend(key);
    if (!scatter) return;
    scatter.set({colorBy: "valueA", pointColor: key.palette, pointOrder: key.order || null});
    await scatter.draw({x: NX, y: NY, z: key.index}, {zDataType: "categorical", preventFilterReset: true,
                                                      spatialIndex});
    spatialIndex = spatialIndex || scatter.get("spatialIndex");
    schedule();
  }

  // ---- hover card and details (text only: ids may hold any characters)
  function rows(i) {
    const out = [["node", String(ids[i])]];
    if (community) out.push(["community", communities.names[community[i]]]);
    if (values.degree) out.push(["degree", String(values.degree[i])]);
    for (const k of Object.keys(values)) {
      if (k === "degree") continue;
      const v = values[k][i];
      out.push([k === "np" ? "NP@deg" : k, Number.isNaN(v) ? "-" : v.toFixed(3)]);
    }
    if (classes) out.push(["label", classNames[classes[i]]]);
    if (component && meta.n_components > 1) {
      out.push(["component", `${component[i] + 1} of ${meta.n_components} (${meta.component_sizes[component[i]]} nodes)`]);
    }
    return out;
  }
  function card(element, i) {
    element.replaceChildren();
    rows(i).forEach(([k, v], j) => {
      if (j) element.append(document.createElement("br"));
      const b = document.createElement("b");
      b.textContent = k;
      element.append(b, document.createTextNode(" " + v));
    });
  }
  let mouse = [0, 0];
  canvas.addEventListener("pointermove", e => {
    const r = canvas.getBoundingClientRect();
    mouse = [e.clientX - r.left, e.clientY - r.top];
  });
  canvas.addEventListener("pointerleave", () => { tip.style.display = "none"; });
  function hover(i) {
    card(tip, i); tip.dataset.index = String(i); tip.style.display = "block";
    tip.style.left = `${Math.min(mouse[0] + 14, width - tip.offsetWidth - 4)}px`;
    tip.style.top = `${Math.min(mouse[1] + 14, height - tip.offsetHeight - 4)}px`;
  }

  // ---- search: exact id, then prefix, then substring, then subsequence, then within a small edit distance
  let lowered = null;
  function editWithin(a, b, limit) {  // Levenshtein distance of a and b's prefix of a's length, if <= limit
    const m = a.length, s = b.slice(0, m + limit);
    let prev = Array.from({length: s.length + 1}, (_, j) => j);
    for (let i = 1; i <= m; i++) {
      const cur = [i];
      let best = i;
      for (let j = 1; j <= s.length; j++) {
        cur[j] = Math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] === s[j - 1] ? 0 : 1));
        best = Math.min(best, cur[j]);
      }
      if (best > limit) return false;
      prev = cur;
    }
    return Math.min(...prev.slice(Math.max(0, m - limit))) <= limit;
  }
  function search(text, k = 10) {
    const q = String(text).trim().toLowerCase();
    if (!q) return [];
    if (!lowered) lowered = Array.from({length: n}, (_, i) => String(ids[i]).toLowerCase());
    const degree = values.degree, tiers = [[], [], [], []];
    for (let i = 0; i < n; i++) {
      const s = lowered[i];
      if (s === q) tiers[0].push(i);
      else if (s.startsWith(q)) tiers[1].push(i);
      else if (s.includes(q)) tiers[2].push(i);
      else if (q.length >= 2) {
        let j = 0;
        for (let c = 0; c < s.length && j < q.length; c++) if (s[c] === q[j]) j++;
        if (j === q.length) tiers[3].push(i);
      }
    }
    const better = (a, b) => (degree ? degree[b] - degree[a] : 0) || lowered[a].length - lowered[b].length || a - b;
    let hits = [];
    for (const t of tiers) { hits = hits.concat(t.sort(better)); if (hits.length >= k) break; }
    if (hits.length < k && q.length >= 3) {  // typing errors
      const limit = q.length < 6 ? 1 : 2, seen = new Set(hits), typos = [];
      for (let i = 0; i < n && typos.length < 10 * k; i++) if (!seen.has(i) && editWithin(q, lowered[i], limit)) typos.push(i);
      hits = hits.concat(typos.sort(better));
    }
    return hits.slice(0, k);
  }
  function goTo(i) {
    found = i;
    card(info, i);
    setView(X[i], Y[i], Math.max(view.scale, 4 * home.scale));
  }
  function find(text) {
    const hits = search(text, 1);
    if (!hits.length) { found = -1; info.textContent = `no node matches ${text}`; schedule(); return -1; }
    goTo(hits[0]);
    return hits[0];
  }
  const hitsList = $("hits");
  function showHits() {
    hitsList.replaceChildren();
    for (const i of search($("node").value, 10)) {
      const li = document.createElement("li");
      li.textContent = String(ids[i]) + (values.degree ? ` (degree ${values.degree[i]})` : "");
      li.addEventListener("mousedown", e => { e.preventDefault(); goTo(i); hitsList.replaceChildren(); });
      hitsList.append(li);
    }
  }
  let typing = null;
  $("node").addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(showHits, n > 200000 ? 250 : 60); });
  $("node").addEventListener("blur", () => setTimeout(() => hitsList.replaceChildren(), 150));
  $("find").addEventListener("submit", e => { e.preventDefault(); hitsList.replaceChildren(); find($("node").value); });

  // ---- selection (lasso or box; shift+drag lassos in pan mode) and its CSV export
  let selected = [];
  const csvField = v => (/[",\r\n]/.test(v) ? `"${v.replace(/"/g, '""')}"` : v);
  function selectionCsv() { return "id\n" + selected.map(i => csvField(String(ids[i])) + "\n").join(""); }
  function showSelection() {
    $("selection").textContent = selected.length ? `${selected.length} selected` : "none selected";
    $("export").disabled = !selected.length;
  }
  $("export").addEventListener("click", () => {
    const url = URL.createObjectURL(new Blob([selectionCsv()], {type: "text/csv"}));
    const a = document.createElement("a");
    a.href = url; a.download = "selection.csv"; document.body.append(a); a.click(); a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  });
  $("mode").addEventListener("change", () => {
    const mode = $("mode").value;
    if (scatter) scatter.set({mouseMode: mode === "pan" ? "panZoom" : "lasso", lassoType: mode === "box" ? "rectangle" : "freeform"});
  });

  // ---- pinch zoom and one-finger pan on touch screens (the camera handles mouse and wheel)
  const touches = new Map();
  let pinch = null;
  canvas.addEventListener("pointerdown", e => { if (e.pointerType === "touch") touches.set(e.pointerId, [e.clientX, e.clientY]); });
  const endTouch = e => { touches.delete(e.pointerId); pinch = null; };
  canvas.addEventListener("pointerup", endTouch);
  canvas.addEventListener("pointercancel", endTouch);
  canvas.addEventListener("pointermove", e => {
    if (e.pointerType !== "touch" || !touches.has(e.pointerId) || touches.size !== 2) return;
    touches.set(e.pointerId, [e.clientX, e.clientY]);
    const r = canvas.getBoundingClientRect(), [[ax, ay], [bx, by]] = [...touches.values()];
    const mid = [(ax + bx) / 2 - r.left, (ay + by) / 2 - r.top], dist = Math.hypot(ax - bx, ay - by);
    if (!pinch) { pinch = {dist, at: toData(...mid), scale: view.scale}; return; }
    const scale = pinch.scale * dist / Math.max(pinch.dist, 1);  // the pinched data point stays under the fingers
    setView(pinch.at[0] - (mid[0] - width / 2) / scale, pinch.at[1] + (mid[1] - height / 2) / scale, scale);
  });
  canvas.addEventListener("touchstart", e => { if (e.touches.length > 1) e.preventDefault(); }, {passive: false});

  // ---- wiring
  $("colour").addEventListener("change", () => colourBy($("colour").value));
  for (const id of ["edges", "labels-on"]) $(id).addEventListener("change", schedule);
  $("legend-on").addEventListener("change", () => showLegend(colourKey(currentKey)));
  $("reset").addEventListener("click", () => fit(meta.home));
  $("all").addEventListener("click", () => fit([x0, x1, y0, y1]));
  const frameTimes = [];
  let home = {scale: 1};
  window.addEventListener("resize", () => {
    measure();
    if (scatter) scatter.set({width, height});
    schedule();
  });
  async function start() {
    fit(meta.home);
    home = {scale: view.scale};
    if (scatter) {
      scatter.subscribe("view", ({view: matrix}) => { syncView(matrix); tip.style.display = "none"; schedule(); });
      scatter.subscribe("draw", () => {
        frameTimes.push(performance.now());
        if (frameTimes.length > 600) frameTimes.splice(0, 300);
        document.body.dataset.frames = String(Number(document.body.dataset.frames || 0) + 1);
      });
      scatter.subscribe("pointOver", hover);
      scatter.subscribe("pointOut", () => { tip.style.display = "none"; });
      scatter.subscribe("select", ({points}) => { selected = Array.from(points).sort((a, b) => a - b); showSelection(); });
      scatter.subscribe("deselect", () => { selected = []; showSelection(); });
    }
    await colourBy($("colour").value);
    if (scatter) syncView(scatter.get("cameraView"));
    // edges start on only when their ink in the first frame is at most the points' ink
    if (edges && !$("edges").dataset.fixed) {
      const {count, inside} = visibleEdges();
      let length = 0;
      for (let e = 0; e < edges.length; e += 2) {
        const a = edges[e], b = edges[e + 1];
        if (inside(a) || inside(b)) length += Math.hypot(X[a] - X[b], Y[a] - Y[b]) * view.scale;
      }
      $("edges").checked = count > 0 && 0.6 * length <= n * pointSize * pointSize;
    }
    showSelection();
    drawOverlay();
    window.scalembMap = {n, view, toScreen, toData, find, search, setView, fit, colourBy, selectionCsv,
                         select: indices => scatter.select(indices), selected: () => selected.slice(),
                         labels: () => placed.map(b => ({text: b.text, kind: b.kind, index: b.index,
                                                         box: [b.x, b.y, b.w, b.h]})),
                         edgesDrawn: () => lastEdges, redraw: schedule, size: () => [width, height], frameTimes, scatter, renderer, glName,
                         gl: renderer === "webgl", ready: true};
    document.body.dataset.readyMs = performance.now().toFixed(0);  // since navigation started
    document.body.dataset.ready = "1";
  }
  start();
})();
