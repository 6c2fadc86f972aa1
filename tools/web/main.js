// The training page: trains digits_mlp.sart on WebGPU through sinter-web's JavaScript API, plots
// the loss as it goes, scores the held-out split with digits_mlp_eval.sart and classifies what
// the user draws. `?steps=N&autostart` starts training on load (the end-to-end test uses it);
// `window.sinter` reports progress to such a test.
import init, { Session, readNpy } from "./pkg/sinter_web.js";

const BATCH = 32;
const PIXELS = 64;
const CLASSES = 10;
const READ_LOSS_EVERY = 10;

const $ = (id) => document.getElementById(id);
const query = new URLSearchParams(location.search);
const report = (window.sinter = { state: "loading", losses: [] });

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

async function fetchBytes(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`cannot fetch ${url}: HTTP ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

async function fetchNpy(url) {
  return readNpy(await fetchBytes(url), url);
}

/** The indices 0..n-1 in an order fixed by `seed` (mulberry32 and Fisher–Yates). */
function shuffled(n, seed) {
  let s = seed >>> 0;
  const random = () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const order = Array.from({ length: n }, (_, i) => i);
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [order[i], order[j]] = [order[j], order[i]];
  }
  return order;
}

/** The loss curve: one point per read loss, axes scaled to what has been seen. */
class LossChart {
  constructor(canvas) {
    this.canvas = canvas;
    this.points = [];
    this.lastStep = 1;
  }

  reset(lastStep) {
    this.points = [];
    this.lastStep = lastStep;
    this.draw();
  }

  add(step, loss) {
    this.points.push([step, loss]);
    this.draw();
  }

  draw() {
    const { canvas, points } = this;
    const g = canvas.getContext("2d");
    const [w, h] = [canvas.width, canvas.height];
    const pad = { left: 48, right: 12, top: 12, bottom: 28 };
    g.clearRect(0, 0, w, h);
    const top = Math.max(...points.map(([, l]) => l), 1e-3);
    const x = (step) => pad.left + ((w - pad.left - pad.right) * step) / this.lastStep;
    const y = (loss) => h - pad.bottom - ((h - pad.top - pad.bottom) * loss) / top;
    g.strokeStyle = "#999";
    g.fillStyle = "#555";
    g.font = "12px system-ui, sans-serif";
    g.beginPath();
    g.moveTo(pad.left, pad.top);
    g.lineTo(pad.left, h - pad.bottom);
    g.lineTo(w - pad.right, h - pad.bottom);
    g.stroke();
    g.textAlign = "right";
    for (const v of [0, top / 2, top]) g.fillText(v.toFixed(2), pad.left - 6, y(v) + 4);
    g.textAlign = "center";
    for (const s of [0, Math.round(this.lastStep / 2), this.lastStep]) {
      g.fillText(String(s), x(s), h - 8);
    }
    g.strokeStyle = "#3b7dd8";
    g.lineWidth = 2;
    g.beginPath();
    points.forEach(([s, l], i) => (i ? g.lineTo(x(s), y(l)) : g.moveTo(x(s), y(l))));
    g.stroke();
    g.lineWidth = 1;
  }
}

/** Row `i` of a [rows, 10] logits array: its argmax. */
function argmax(logits, i) {
  let best = 0;
  for (let c = 1; c < CLASSES; c++) {
    if (logits[i * CLASSES + c] > logits[i * CLASSES + best]) best = c;
  }
  return best;
}

/** The page's state once the artifacts and data are loaded. */
class Trainer {
  constructor(train, scoring, trainSet, testSet) {
    Object.assign(this, { train, scoring, trainSet, testSet });
    this.chart = new LossChart($("loss"));
    this.trained = false;
  }

  async run(steps) {
    const { train, trainSet } = this;
    const count = trainSet.labels.shape[0];
    const x = new Float32Array(BATCH * PIXELS);
    const labels = new Int32Array(BATCH);
    let epoch = 1;
    let order = shuffled(count, epoch);
    let next = 0;
    this.chart.reset(steps);
    report.losses = [];
    report.state = "training";
    const start = performance.now();
    for (let step = 1; step <= steps; step++) {
      if (next + BATCH > count) {
        order = shuffled(count, ++epoch);
        next = 0;
      }
      for (let i = 0; i < BATCH; i++) {
        const sample = order[next + i];
        x.set(trainSet.x.data.subarray(sample * PIXELS, (sample + 1) * PIXELS), i * PIXELS);
        labels[i] = trainSet.labels.data[sample];
      }
      next += BATCH;
      const read = step % READ_LOSS_EVERY === 0 || step === steps ? ["loss"] : [];
      const out = await train.step({ x, labels }, read);
      if (out.loss) {
        const loss = out.loss[0];
        const seconds = (performance.now() - start) / 1000;
        report.losses.push([step, loss]);
        report.stepsPerSecond = step / seconds;
        this.chart.add(step, loss);
        $("stats").textContent =
          `step ${step}/${steps} · loss ${loss.toFixed(4)} · ` +
          `${report.stepsPerSecond.toFixed(0)} steps/s · epoch ${epoch}`;
        if (!Number.isFinite(loss)) throw new Error(`the loss is ${loss} at step ${step}`);
        // Let the page paint.
        await new Promise((resolve) => setTimeout(resolve, 0));
      }
    }
    report.seconds = (performance.now() - start) / 1000;
    report.steps = steps;
    await this.score();
  }

  /** Copies the trained params into the eval graph and scores the held-out split. */
  async score() {
    const { train, scoring, testSet } = this;
    const names = scoring.weights.map((w) => w.name);
    scoring.importWeights(await train.exportWeights(names));
    const { logits } = await scoring.run({ x: testSet.x.data, labels: testSet.labels.data });
    const rows = testSet.labels.shape[0];
    let right = 0;
    for (let i = 0; i < rows; i++) right += argmax(logits, i) === testSet.labels.data[i];
    report.accuracy = right / rows;
    $("accuracy").textContent =
      `held-out accuracy: ${(100 * report.accuracy).toFixed(2)}% (${right}/${rows})`;
    this.trained = true;
    report.state = "done";
  }

  /**
   * Class probabilities of one 8×8 image (64 values in [0, 1]). The eval graph takes 300 images
   * at once: the drawing is row 0, the other rows are blank.
   */
  async classify(pixels) {
    const x = new Float32Array(this.testSet.x.data.length);
    x.set(pixels);
    const labels = new Int32Array(this.testSet.labels.data.length);
    const { logits } = await this.scoring.run({ x, labels });
    const row = Array.from(logits.subarray(0, CLASSES));
    const top = Math.max(...row);
    const exp = row.map((v) => Math.exp(v - top));
    const sum = exp.reduce((a, b) => a + b, 0);
    return exp.map((v) => v / sum);
  }
}

/**
 * The drawing pad, reduced the way the UCI digits were made: the ink's bounding box scaled into
 * a 32×32 bitmap, then the ink counted in 4×4 blocks (0..16, here divided by 16).
 */
class DrawingPad {
  constructor(canvas, preview, onDrawn) {
    Object.assign(this, { canvas, preview, onDrawn });
    const g = canvas.getContext("2d");
    g.lineCap = g.lineJoin = "round";
    g.lineWidth = canvas.width / 11;
    g.strokeStyle = "#fff";
    let last = null;
    const at = (e) => {
      const r = canvas.getBoundingClientRect();
      return [((e.clientX - r.left) * canvas.width) / r.width, ((e.clientY - r.top) * canvas.height) / r.height];
    };
    canvas.addEventListener("pointerdown", (e) => {
      last = at(e);
      try {
        canvas.setPointerCapture(e.pointerId);
      } catch {
        // a synthetic pointer (a test's) cannot be captured; drawing works without
      }
    });
    canvas.addEventListener("pointermove", (e) => {
      if (!last) return;
      const p = at(e);
      g.beginPath();
      g.moveTo(...last);
      g.lineTo(...p);
      g.stroke();
      last = p;
    });
    const end = () => {
      if (last) this.onDrawn(this.pixels());
      last = null;
    };
    canvas.addEventListener("pointerup", end);
    canvas.addEventListener("pointercancel", end);
  }

  clear() {
    this.canvas.getContext("2d").clearRect(0, 0, this.canvas.width, this.canvas.height);
    this.preview.getContext("2d").clearRect(0, 0, this.preview.width, this.preview.height);
  }

  pixels() {
    const { width, height } = this.canvas;
    const ink = this.canvas.getContext("2d").getImageData(0, 0, width, height).data;
    let [x0, y0, x1, y1] = [width, height, -1, -1];
    for (let y = 0; y < height; y++) {
      for (let x = 0; x < width; x++) {
        if (ink[(y * width + x) * 4 + 3] > 0) {
          x0 = Math.min(x0, x);
          y0 = Math.min(y0, y);
          x1 = Math.max(x1, x);
          y1 = Math.max(y1, y);
        }
      }
    }
    const out = new Float32Array(PIXELS);
    if (x1 < 0) return out;
    const side = Math.max(x1 - x0, y1 - y0) + 1;
    const bitmap = new OffscreenCanvas(32, 32);
    const b = bitmap.getContext("2d");
    // Centered, aspect kept, as the digits' 32×32 bitmaps.
    const scale = 32 / side;
    b.drawImage(this.canvas, x0, y0, x1 - x0 + 1, y1 - y0 + 1,
      (32 - (x1 - x0 + 1) * scale) / 2, (32 - (y1 - y0 + 1) * scale) / 2,
      (x1 - x0 + 1) * scale, (y1 - y0 + 1) * scale);
    const bits = b.getImageData(0, 0, 32, 32).data;
    for (let y = 0; y < 32; y++) {
      for (let x = 0; x < 32; x++) {
        if (bits[(y * 32 + x) * 4 + 3] > 127) out[(y >> 2) * 8 + (x >> 2)] += 1 / 16;
      }
    }
    const p = this.preview.getContext("2d");
    const cell = this.preview.width / 8;
    for (let i = 0; i < PIXELS; i++) {
      const v = Math.round(255 * (1 - out[i]));
      p.fillStyle = `rgb(${v},${v},${v})`;
      p.fillRect((i % 8) * cell, Math.floor(i / 8) * cell, cell, cell);
    }
    return out;
  }
}

function showProbabilities(probabilities) {
  const list = $("probabilities");
  list.replaceChildren(
    ...probabilities.map((p) => {
      const item = document.createElement("li");
      const bar = document.createElement("span");
      bar.style.width = `${Math.round(120 * p)}px`;
      item.append(`${(100 * p).toFixed(1)}%`, bar);
      return item;
    }),
  );
  const best = probabilities.indexOf(Math.max(...probabilities));
  $("prediction").textContent = `It looks like a ${best}.`;
}

async function main() {
  await init();
  if (!navigator.gpu) {
    throw new Error(
      "this browser has no WebGPU: use Chrome or Edge 113+ (on Linux, Chromium with " +
        "--enable-unsafe-webgpu), over http://localhost or https",
    );
  }
  const [train, scoring, trainX, trainLabels, testX, testLabels] = await Promise.all([
    Session.fromUrl("artifacts/digits_mlp.sart"),
    Session.fromUrl("artifacts/digits_mlp_eval.sart"),
    fetchNpy("data/train/x.npy"),
    fetchNpy("data/train/labels.npy"),
    fetchNpy("data/test/x.npy"),
    fetchNpy("data/test/labels.npy"),
  ]);
  const trainer = new Trainer(
    train,
    scoring,
    { x: trainX, labels: trainLabels },
    { x: testX, labels: testLabels },
  );
  report.classify = (pixels) => trainer.classify(pixels);
  $("adapter").textContent = `on ${train.adapter}`;
  if (query.has("steps")) $("steps").value = query.get("steps");
  const start = async () => {
    $("train").disabled = true;
    setStatus("Training…");
    try {
      await trainer.run(Number($("steps").value));
      setStatus("Trained. Draw a digit below.");
    } catch (e) {
      fail(e);
    } finally {
      $("train").disabled = false;
    }
  };
  $("train").addEventListener("click", start);
  const pad = new DrawingPad($("pad"), $("preview"), async (pixels) => {
    if (trainer.trained) showProbabilities(await trainer.classify(pixels));
  });
  $("clear").addEventListener("click", () => pad.clear());
  $("train").disabled = false;
  report.state = "ready";
  setStatus("Ready.");
  if (query.has("autostart")) await start();
}

function fail(e) {
  report.state = "error";
  report.error = String(e?.message ?? e);
  setStatus(`Error: ${report.error}`, true);
  console.error(e);
}

main().catch(fail);
