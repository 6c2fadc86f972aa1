// The training page, two tabs. Digits: trains digits_mlp.sart on WebGPU through sinter-web's
// JavaScript API, plots the loss as it goes, scores the held-out split with
// digits_mlp_eval.sart and classifies what the user draws. Text: trains the character model
// (text_train.sart) and every few hundred steps hands its weights to the generation artifact
// (text_generate.sart), which writes a continuation of the prompt token by token.
// `?steps=N&autostart` starts the open tab's training on load (`?tab=text` opens the text tab;
// the end-to-end test uses both); `window.sinter` reports progress to such a test.
import init, { Generator, Session, readNpy } from "./pkg/sinter_web.js";

const BATCH = 32;
const PIXELS = 64;
const CLASSES = 10;
const READ_LOSS_EVERY = 10;
/** The character model's batch of windows and their length (transformer_train.sir). */
const TEXT_BATCH = 4;
const TEXT_CONTEXT = 16;
/** Characters written after the prompt each time. */
const TEXT_WRITE = 120;

const $ = (id) => document.getElementById(id);
const query = new URLSearchParams(location.search);
const report = (window.sinter = {
  state: "loading",
  losses: [],
  text: { state: "loading", losses: [], samples: [] },
});

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

/** Batches of sample indices: each epoch a new order (seeded by its number), whole batches. */
class Epochs {
  constructor(count, batch) {
    Object.assign(this, { count, batch, epoch: 1, next: 0 });
    this.order = shuffled(count, 1);
  }

  /** The indices of the next batch. */
  take() {
    if (this.next + this.batch > this.count) {
      this.order = shuffled(this.count, ++this.epoch);
      this.next = 0;
    }
    this.next += this.batch;
    return this.order.slice(this.next - this.batch, this.next);
  }
}

/**
 * Records a loss read at `step` of `steps` in `record`, plots it and shows it in `stats`; throws
 * on a loss that is not finite, and lets the page paint.
 */
async function showLoss(chart, stats, record, step, steps, loss, seconds, epoch) {
  record.losses.push([step, loss]);
  record.stepsPerSecond = step / seconds;
  chart.add(step, loss);
  $(stats).textContent =
    `step ${step}/${steps} · loss ${loss.toFixed(4)} · ` +
    `${record.stepsPerSecond.toFixed(0)} steps/s · epoch ${epoch}`;
  if (!Number.isFinite(loss)) throw new Error(`the loss is ${loss} at step ${step}`);
  await new Promise((resolve) => setTimeout(resolve, 0));
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
    const epochs = new Epochs(count, BATCH);
    this.chart.reset(steps);
    report.losses = [];
    report.state = "training";
    const start = performance.now();
    for (let step = 1; step <= steps; step++) {
      epochs.take().forEach((sample, i) => {
        x.set(trainSet.x.data.subarray(sample * PIXELS, (sample + 1) * PIXELS), i * PIXELS);
        labels[i] = trainSet.labels.data[sample];
      });
      const read = step % READ_LOSS_EVERY === 0 || step === steps ? ["loss"] : [];
      const out = await train.step({ x, labels }, read);
      if (out.loss) {
        const seconds = (performance.now() - start) / 1000;
        await showLoss(this.chart, "stats", report, step, steps, out.loss[0], seconds, epochs.epoch);
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

/** The character model: training, and writing with the generation artifact. */
class TextTrainer {
  constructor(train, generator, ids, targets, vocab) {
    Object.assign(this, { train, generator, ids, targets, vocab });
    this.index = new Map(vocab.map((piece, i) => [piece, i]));
    this.chart = new LossChart($("text-loss"));
  }

  /** Token ids of `text`, one per character (the vocabulary's pieces are characters). */
  encode(text) {
    const ids = [];
    for (const c of text) {
      const id = this.index.get(c);
      if (id === undefined) {
        throw new Error(`the prompt's character ${JSON.stringify(c)} is not in the model's vocabulary`);
      }
      ids.push(id);
    }
    if (ids.length === 0) throw new Error("the prompt is empty");
    return Int32Array.from(ids);
  }

  async run(steps, every) {
    const { train, ids, targets } = this;
    const count = ids.shape[0];
    const batchIds = new Int32Array(TEXT_BATCH * TEXT_CONTEXT);
    const batchTargets = new Int32Array(TEXT_BATCH * TEXT_CONTEXT);
    const epochs = new Epochs(count, TEXT_BATCH);
    const text = report.text;
    text.losses = [];
    text.samples = [];
    text.state = "training";
    $("text-history").replaceChildren();
    this.chart.reset(steps);
    const start = performance.now();
    let writing = 0; // milliseconds spent writing, not training
    for (let step = 1; step <= steps; step++) {
      epochs.take().forEach((window, i) => {
        const at = window * TEXT_CONTEXT;
        batchIds.set(ids.data.subarray(at, at + TEXT_CONTEXT), i * TEXT_CONTEXT);
        batchTargets.set(targets.data.subarray(at, at + TEXT_CONTEXT), i * TEXT_CONTEXT);
      });
      const write = step % every === 0 || step === steps;
      const read = step % READ_LOSS_EVERY === 0 || write ? ["loss"] : [];
      const out = await train.step({ ids: batchIds, targets: batchTargets }, read);
      if (out.loss) {
        const seconds = (performance.now() - start - writing) / 1000;
        const loss = out.loss[0];
        await showLoss(this.chart, "text-stats", text, step, steps, loss, seconds, epochs.epoch);
      }
      if (write) {
        const t = performance.now();
        await this.write(step);
        writing += performance.now() - t;
      }
    }
    text.seconds = (performance.now() - start) / 1000;
    text.steps = steps;
    text.state = "done";
  }

  /** Copies the training step's params into the generator and writes after the prompt. */
  async write(step) {
    const { train, generator, vocab } = this;
    const names = generator.weights.map((w) => w.name);
    generator.importWeights(await train.exportWeights(names));
    const prompt = $("text-prompt").value;
    const ids = this.encode(prompt);
    const temperature = Number($("text-temperature").value);
    const pre = $("text-sample");
    let written = prompt;
    pre.textContent = written;
    let first = null;
    await generator.generate(ids, TEXT_WRITE, { temperature, seed: step }, (token) => {
      first ??= performance.now();
      written += vocab[token];
      pre.textContent = written;
    });
    const seconds = (performance.now() - first) / 1000;
    const speed = (TEXT_WRITE - 1) / seconds;
    $("text-speed").textContent =
      `after ${step} steps · ${speed.toFixed(0)} characters/s (one GPU submission each)`;
    report.text.samples.push({ step, text: written, charactersPerSecond: speed });
    const item = document.createElement("li");
    item.textContent = `step ${step}: ${written}`;
    $("text-history").append(item);
  }
}

/** Shows one tab's panel. */
function showTab(name) {
  for (const tab of ["digits", "text"]) {
    $(tab).hidden = tab !== name;
    $(`tab-${tab}`).setAttribute("aria-selected", String(tab === name));
  }
}

async function fetchVocabulary(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`cannot fetch ${url}: HTTP ${response.status}`);
  const lines = (await response.text()).split("\n").filter((line) => line.length > 0);
  return lines.map((line) => JSON.parse(line));
}

async function main() {
  await init();
  if (!navigator.gpu) {
    throw new Error(
      "this browser has no WebGPU: use Chrome or Edge 113+ (on Linux, Chromium with " +
        "--enable-unsafe-webgpu), over http://localhost or https",
    );
  }
  const tab = query.get("tab") === "text" ? "text" : "digits";
  showTab(tab);
  $("tab-digits").addEventListener("click", () => showTab("digits"));
  $("tab-text").addEventListener("click", () => showTab("text"));
  const [train, scoring, trainX, trainLabels, testX, testLabels] = await Promise.all([
    Session.fromUrl("artifacts/digits_mlp.sart"),
    Session.fromUrl("artifacts/digits_mlp_eval.sart"),
    fetchNpy("data/train/x.npy"),
    fetchNpy("data/train/labels.npy"),
    fetchNpy("data/test/x.npy"),
    fetchNpy("data/test/labels.npy"),
  ]);
  const [textTrain, textGenerator, textIds, textTargets, vocab] = await Promise.all([
    Session.fromUrl("artifacts/text_train.sart"),
    Generator.fromUrl("artifacts/text_generate.sart"),
    fetchNpy("data/text/ids.npy"),
    fetchNpy("data/text/targets.npy"),
    fetchVocabulary("data/text/vocab.txt"),
  ]);
  const text = new TextTrainer(textTrain, textGenerator, textIds, textTargets, vocab);
  const trainer = new Trainer(
    train,
    scoring,
    { x: trainX, labels: trainLabels },
    { x: testX, labels: testLabels },
  );
  report.classify = (pixels) => trainer.classify(pixels);
  $("adapter").textContent = `on ${train.adapter}`;
  if (query.has("steps")) $(tab === "text" ? "text-steps" : "steps").value = query.get("steps");
  if (query.has("every")) $("text-every").value = query.get("every");
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
  const textButtons = ["text-train", "text-write"];
  const busy = (on) => textButtons.forEach((id) => ($(id).disabled = on));
  const startText = async () => {
    busy(true);
    setStatus("Training the language model…");
    try {
      await text.run(Number($("text-steps").value), Number($("text-every").value));
      setStatus("Trained. Change the prompt and write again.");
    } catch (e) {
      failText(e);
    } finally {
      busy(false);
    }
  };
  $("text-train").addEventListener("click", startText);
  $("text-write").addEventListener("click", async () => {
    busy(true);
    try {
      await text.write(report.text.steps ?? 0);
      setStatus("Written.");
    } catch (e) {
      failText(e);
    } finally {
      busy(false);
    }
  });
  $("train").disabled = false;
  busy(false);
  report.state = "ready";
  report.text.state = "ready";
  setStatus("Ready.");
  if (query.has("autostart")) await (tab === "text" ? startText() : start());
}

function failText(e) {
  report.text.state = "error";
  report.text.error = String(e?.message ?? e);
  setStatus(`Error: ${report.text.error}`, true);
  console.error(e);
}

function fail(e) {
  report.state = "error";
  report.text.state = "error";
  report.error = String(e?.message ?? e);
  setStatus(`Error: ${report.error}`, true);
  console.error(e);
}

main().catch(fail);
