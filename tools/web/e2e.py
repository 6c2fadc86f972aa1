#!/usr/bin/env python3
"""End-to-end test of the training page in headless Chromium (WebGPU on SwiftShader).

Serves tools/web/ (built by build.sh), drives Chromium through chromedriver's WebDriver API
(plain HTTP and JSON: the standard library only), opens the page with ?steps=N&autostart, waits
for training and held-out scoring, fails unless the held-out accuracy reaches --min-accuracy,
draws a "1" on the pad with pointer events and checks the prediction, and saves screenshots of
the loss curve and of the page. Then opens the text tab (?tab=text&steps=N&every=M&autostart),
which trains the character model and writes text with its generation artifact every M steps,
and fails unless the loss falls by --min-text-drop and every text written continues the prompt
with the right number of characters of the vocabulary; saves a screenshot of the tab.

    tools/web/build.sh && tools/web/e2e.py --screenshots target/ci-artifacts
"""

import argparse
import base64
import functools
import http.server
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

WEB = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(WEB))
# The browser flags, shared with the wasm tests.
WEBDRIVER_JSON = os.path.join(ROOT, "runtime", "web", "webdriver.json")
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C element reference key


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(directory):
    handler = functools.partial(Quiet, directory=directory)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def call(base, method, path, body=None):
    """One WebDriver command; returns its `value` or raises with the driver's message."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        base + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.load(response)["value"]
    except urllib.error.HTTPError as e:
        value = json.load(e).get("value", {})
        raise RuntimeError(f"WebDriver {method} {path}: {value.get('message', value)}") from None


def start_chromedriver(chromedriver, port):
    process = subprocess.Popen(
        [chromedriver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if call(base, "GET", "/status").get("ready"):
                return process, base
        except (OSError, RuntimeError):
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{chromedriver} did not start on port {port}")


def evaluate(base, session, expression):
    """The value of a JavaScript expression in the page."""
    return call(base, "POST", f"/session/{session}/execute/sync",
                {"script": f"return {expression};", "args": []})


def page_state(base, session):
    return evaluate(base, session,
                    "(s => ({state: s.state || 'loading', error: s.error || null, accuracy: "
                    "s.accuracy ?? null, steps: s.steps ?? null, seconds: s.seconds ?? null, "
                    "stepsPerSecond: s.stepsPerSecond ?? null, last: (s.losses || []).slice(-1)[0] "
                    "|| null, status: document.getElementById('status').textContent}))"
                    "(window.sinter || {})")


def text_state(base, session):
    return evaluate(base, session,
                    "(t => ({state: t.state || 'loading', error: t.error || null, losses: "
                    "t.losses || [], samples: t.samples || [], seconds: t.seconds ?? null, "
                    "stepsPerSecond: t.stepsPerSecond ?? null, status: "
                    "document.getElementById('status').textContent}))((window.sinter || {}).text "
                    "|| {})")


def open_and_wait(base, session, url, poll, timeout, describe):
    """Opens `url` and polls the page until its state is `done` or `error`, printing progress
    every 15 s; returns the last state."""
    call(base, "POST", f"/session/{session}/url", {"url": url})
    started = time.monotonic()
    reported = 0.0
    while True:
        state = poll(base, session)
        elapsed = time.monotonic() - started
        if state["state"] in ("done", "error"):
            return state
        if elapsed > timeout:
            raise RuntimeError(f"no result after {timeout:.0f} s: {describe(state)}")
        if elapsed - reported >= 15:
            reported = elapsed
            print(f"  {elapsed:4.0f} s: {describe(state)}", flush=True)
        time.sleep(1)


def check_text(state, vocabulary, prompt, steps, every, written, min_drop):
    """The text tab's result: the loss fell, and every text continues the prompt."""
    losses = state["losses"]
    first, last = losses[0][1], losses[-1][1]
    print(f"text: trained {steps} steps in {state['seconds']:.1f} s "
          f"({state['stepsPerSecond']:.0f} steps/s), loss {first:.3f} at step {losses[0][0]} "
          f"to {last:.3f}")
    if not first - last >= min_drop:
        raise RuntimeError(f"the text model's loss went from {first} to {last}, not down by "
                           f"{min_drop}")
    expected = sorted({s for s in range(every, steps + 1, every)} | {steps})
    got = [s["step"] for s in state["samples"]]
    if got != expected:
        raise RuntimeError(f"text written after steps {got}, expected {expected}")
    for sample in state["samples"]:
        text = sample["text"]
        print(f"  after {sample['step']} steps ({sample['charactersPerSecond']:.0f} "
              f"characters/s): {text!r}")
        body = text[len(prompt):]
        if not text.startswith(prompt) or len(body) != written:
            raise RuntimeError(f"expected the prompt and {written} characters, got {text!r}")
        strange = set(body) - set(vocabulary)
        if strange:
            raise RuntimeError(f"characters outside the vocabulary: {sorted(strange)}")


def screenshot(base, session, selector, path):
    element = call(base, "POST", f"/session/{session}/element",
                   {"using": "css selector", "value": selector})[ELEMENT]
    png = call(base, "GET", f"/session/{session}/element/{element}/screenshot")
    with open(path, "wb") as f:
        f.write(base64.b64decode(png))


# Draws a vertical stroke (a "1") on the pad with pointer events, as a user would, and waits
# for the page's prediction.
DRAW_ONE = """
const done = arguments[arguments.length - 1];
const pad = document.getElementById('pad');
const r = pad.getBoundingClientRect();
const event = (type, y) => pad.dispatchEvent(new PointerEvent(type, {pointerId: 1, bubbles: true,
  clientX: r.left + r.width / 2, clientY: r.top + y * r.height}));
event('pointerdown', 0.15);
for (let y = 0.15; y <= 0.85; y += 0.05) event('pointermove', y);
event('pointerup', 0.85);
const wait = () => {
  const text = document.getElementById('prediction').textContent;
  if (text.startsWith('It looks like')) done(text); else setTimeout(wait, 100);
};
wait();
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--min-accuracy", type=float, default=0.90)
    parser.add_argument("--timeout", type=float, default=900, help="seconds for training")
    parser.add_argument("--chromedriver", default="chromedriver")
    parser.add_argument("--port", type=int, default=9515, help="chromedriver's port")
    parser.add_argument("--screenshots", default=os.path.join(ROOT, "target", "ci-artifacts"))
    parser.add_argument("--text-steps", type=int, default=150)
    parser.add_argument("--text-every", type=int, default=75)
    parser.add_argument("--min-text-drop", type=float, default=0.5,
                        help="how far the text model's loss must fall (from ln 36 = 3.58)")
    args = parser.parse_args()

    for needed in ["pkg/sinter_web.js", "artifacts/digits_mlp.sart", "data/train/x.npy",
                   "artifacts/text_generate.sart", "data/text/vocab.txt"]:
        if not os.path.exists(os.path.join(WEB, needed)):
            sys.exit(f"tools/web/{needed} is missing: run tools/web/build.sh first")
    with open(WEBDRIVER_JSON) as f:
        chrome_options = json.load(f)["goog:chromeOptions"]
    os.makedirs(args.screenshots, exist_ok=True)

    server = serve(WEB)
    driver, base = start_chromedriver(args.chromedriver, args.port)
    session = None
    try:
        session = call(base, "POST", "/session", {"capabilities": {"alwaysMatch": {
            "browserName": "chrome", "goog:chromeOptions": chrome_options}}})["sessionId"]
        call(base, "POST", f"/session/{session}/timeouts", {"script": 60_000})
        # Tall enough that the whole page, loss curve included, is in the screenshots.
        call(base, "POST", f"/session/{session}/window/rect", {"width": 1000, "height": 1400})
        page = f"http://127.0.0.1:{server.server_address[1]}/"
        state = open_and_wait(base, session, f"{page}?steps={args.steps}&autostart", page_state,
                              args.timeout, lambda s: f"{s['status']} last (step, loss): "
                              f"{s['last']}")
        screenshot(base, session, "#loss", os.path.join(args.screenshots, "loss-curve.png"))
        if state["state"] == "error":
            raise RuntimeError(f"the page failed: {state['error']}")
        print(f"trained {state['steps']} steps in {state['seconds']:.1f} s "
              f"({state['stepsPerSecond']:.0f} steps/s), last (step, loss) {state['last']}; "
              f"held-out accuracy {100 * state['accuracy']:.2f}%")
        if state["accuracy"] < args.min_accuracy:
            raise RuntimeError(f"held-out accuracy {state['accuracy']:.4f} is below "
                               f"{args.min_accuracy}")
        prediction = call(base, "POST", f"/session/{session}/execute/async",
                          {"script": DRAW_ONE, "args": []})
        print(f"a stroke drawn on the pad: {prediction!r}")
        screenshot(base, session, "main", os.path.join(args.screenshots, "training-page.png"))
        if prediction != "It looks like a 1.":
            raise RuntimeError(f"a vertical stroke was classified as: {prediction!r}")

        with open(os.path.join(WEB, "data", "text", "vocab.txt"), encoding="utf-8") as f:
            vocabulary = [json.loads(line) for line in f if line.strip()]
        url = f"{page}?tab=text&steps={args.text_steps}&every={args.text_every}&autostart"
        state = open_and_wait(base, session, url, text_state, args.timeout,
                              lambda s: f"{s['status']} last (step, loss): "
                              f"{(s['losses'] or [None])[-1]}")
        screenshot(base, session, "main", os.path.join(args.screenshots, "text-page.png"))
        if state["state"] == "error":
            raise RuntimeError(f"the text tab failed: {state['error']}")
        check_text(state, vocabulary, "The ", args.text_steps, args.text_every, 120,
                   args.min_text_drop)
    finally:
        if session:
            call(base, "DELETE", f"/session/{session}")
        driver.terminate()
        driver.wait()
        server.shutdown()
    print(f"screenshots in {args.screenshots}")


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as e:
        sys.exit(f"error: {e}")
