// The voice page: one realtime session with the server, over WebRTC when it offers it, else a WebSocket.
//
// Both transports carry the same realtime events (OpenAI's GA protocol). Over the WebSocket the
// microphone goes out as input_audio_buffer.append (capture-worklet.js: 24 kHz PCM16) and the answer
// comes back as response.output_audio.delta, played by playback-worklet.js, which says what was
// heard, so a barge-in truncates the item there. Over WebRTC the audio travels as Opus tracks and a
// barge-in sends output_audio_buffer.clear (the server truncates at what it played).
//
// window.voiceStats is what the page measured (latencies, played samples per item, truncations, the
// server's event types but the deltas), read by the tests and the benchmark.

import { RATE, server, stats, errorMessage } from "./voice-shared.js";
import { WebSocketTransport } from "./voice-websocket.js";
import { WebRTCTransport } from "./voice-webrtc.js";

const VOICE_LEVEL = 0.02; // a microphone piece this loud is speech, for the latency readout

const State = Object.freeze({
  IDLE: "Not connected.",
  CONNECTING: "Connecting…",
  LISTENING: "Listening. Speak, or type a message.",
  THINKING: "Thinking…",
  SPEAKING: "Speaking. Talk to interrupt.",
  FAILED: "Not connected: see the error above.",
});

const $ = (id) => document.getElementById(id);

let session = null;
let config = { model: "", webrtc: false, api_key: false, voices: ["default"], transcribes: true };

function setState(name) {
  stats.state = name;
  $("status").textContent = State[name];
  const live = name !== "IDLE" && name !== "FAILED" && name !== "CONNECTING";
  $("talk").textContent = live ? "Stop" : "Start talking";
  $("talk").setAttribute("aria-pressed", String(live));
  $("talk").disabled = name === "CONNECTING";
  $("message").disabled = $("send").disabled = !live;
  $("commit").hidden = !live || $("turns").value !== "none"; // manual turns: the user says when a turn ends
}

function showError(message) {
  stats.errors.push(message);
  $("error").textContent = message;
  $("error").hidden = false;
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

// -- the transcript --------------------------------------------------------------------------

// The text of an item's line in the transcript (made when first needed, in the order items come).
function line(itemId, role, text = "") {
  let li = document.querySelector(`#transcript li[data-item="${CSS.escape(itemId)}"]`);
  if (!li) {
    li = document.createElement("li");
    li.dataset.item = itemId;
    li.className = role;
    const who = document.createElement("span");
    who.className = "visually-hidden";
    who.textContent = role === "user" ? "You said: " : "Assistant: ";
    const said = document.createElement("span");
    said.textContent = text;
    li.append(who, said);
    $("transcript").append(li);
  }
  return li.lastElementChild;
}

function itemText(item) {
  return (item.content || []).map((part) => part.text || part.transcript || "").join("");
}

// -- connecting ----------------------------------------------------------------------------

async function loadConfig() {
  const response = await fetch(new URL("/voice.json", server));
  config = await response.json();
  $("model").textContent = config.model;
  const voice = $("voice");
  voice.replaceChildren(...config.voices.map((name) => new Option(name, name)));
  $("key-box").hidden = !config.api_key;
}

// A short-lived key for this session, minted with the key typed in the page; null when the server has none.
async function ephemeralKey() {
  if (!config.api_key) return null;
  const key = $("key").value.trim();
  if (!key) throw new Error("This server needs an API key: enter it above.");
  const response = await fetch(new URL("/v1/realtime/client_secrets", server), {
    method: "POST",
    headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
    body: JSON.stringify({ session: { type: "realtime", model: config.model } }),
  });
  if (!response.ok) throw new Error(`The server refused the API key: ${await errorMessage(response)}`);
  return (await response.json()).value;
}

function sessionUpdate() {
  const turns = $("turns").value;
  const detection = turns === "none" ? null : { type: turns };
  return {
    type: "session.update",
    session: {
      type: "realtime",
      audio: {
        // A pipeline without ASR (a speech-native model) has no transcript of what was said.
        input: { transcription: config.transcribes ? { model: "whisper-1" } : null, turn_detection: detection },
        output: { voice: $("voice").value },
      },
    },
  };
}

async function microphone() {
  return navigator.mediaDevices.getUserMedia({
    audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true, channelCount: 1 },
  });
}

class Session {
  constructor(mic, audio) {
    this.mic = mic;
    this.audio = audio; // AudioContext
    this.lastVoice = null; // performance.now() of the last loud microphone piece
    this.turnEnd = null; // when the turn being answered ended; cleared at its first audio
    this.playingItem = null; // the assistant item whose audio is playing
  }

  async start(transportName) {
    const ctx = this.audio;
    await ctx.audioWorklet.addModule("/static/capture-worklet.js");
    await ctx.audioWorklet.addModule("/static/playback-worklet.js");
    await ctx.audioWorklet.addModule("/static/meter-worklet.js");
    this.capture = new AudioWorkletNode(ctx, "capture", { processorOptions: { rate: RATE } });
    ctx.createMediaStreamSource(this.mic).connect(this.capture);
    const key = await ephemeralKey();
    this.transport = transportName === "webrtc" ? new WebRTCTransport(this, key) : new WebSocketTransport(this, key);
    stats.transport = transportName;
    await this.transport.open();
    this.capture.port.onmessage = (event) => {
      if (event.data.peak >= VOICE_LEVEL) this.lastVoice = performance.now();
      this.transport.microphone(event.data.pcm);
    };
    this.transport.send(sessionUpdate());
  }

  close() {
    this.transport?.close();
    this.mic.getTracks().forEach((track) => track.stop());
    this.audio.close();
  }

  send(event) {
    this.transport.send(event);
  }

  // The connection ended without the user asking.
  closed(reason) {
    if (session !== this) return;
    session = null;
    this.close();
    showError(reason);
    setState("FAILED");
  }

  firstAudio() {
    if (this.turnEnd === null) return;
    const ms = Math.round(performance.now() - this.turnEnd);
    this.turnEnd = null;
    stats.latencies.push({ ms, transport: stats.transport });
    const li = document.createElement("li");
    li.textContent = `${ms} ms (${stats.transport})`;
    $("latency").append(li);
  }

  typed(text) {
    const item = { type: "message", role: "user", content: [{ type: "input_text", text }] };
    this.send({ type: "conversation.item.create", item });
    this.send({ type: "response.create" });
    this.turnEnd = performance.now();
  }

  // A server event, whichever transport brought it.
  receive(event) {
    if (!event.type.endsWith(".delta")) stats.events.push(event.type);
    switch (event.type) {
      case "session.updated":
        if (stats.state === "CONNECTING") setState("LISTENING");
        break;
      case "error":
        showError(`The server said: ${event.error.message}`);
        break;
      case "input_audio_buffer.speech_started":
        this.bargeIn();
        break;
      case "input_audio_buffer.speech_stopped":
        this.turnEnd = this.lastVoice ?? performance.now();
        setState("THINKING");
        break;
      case "conversation.item.added": {
        const { item } = event;
        if (item.type === "message") line(item.id, item.role, itemText(item) || (item.role === "user" ? "…" : ""));
        break;
      }
      case "conversation.item.input_audio_transcription.completed":
        line(event.item_id, "user").textContent = event.transcript;
        break;
      case "response.output_audio_transcript.delta":
      case "response.output_text.delta":
        line(event.item_id, "assistant").textContent += event.delta;
        break;
      case "response.output_audio.delta":
        this.transport.play(event);
        break;
      case "response.output_audio.done":
        this.transport.ended(event.item_id);
        break;
      case "conversation.item.truncated":
        line(event.item_id, "assistant").parentElement.classList.add("truncated");
        stats.truncated[event.item_id] ??= event.audio_end_ms;
        break;
      case "response.done":
        if (stats.state === "THINKING") setState("LISTENING");
        break;
    }
  }

  bargeIn() {
    if (this.playingItem === null) return;
    this.transport.interrupt(this.playingItem);
  }

  started(itemId) {
    this.playingItem = itemId;
    this.firstAudio();
    setState("SPEAKING");
  }

  stopped() {
    this.playingItem = null;
    if (stats.state === "SPEAKING") setState("LISTENING");
  }
}

// -- the page -------------------------------------------------------------------------------

async function start() {
  clearError();
  setState("CONNECTING");
  let refusedOrigin = null; // the page cannot read the server's answers: most likely its origin is not allowed
  try {
    if (!config.model) {
      try {
        await loadConfig();
      } catch {
        refusedOrigin =
          `This page (origin ${location.origin}) may not use the server at ${server.origin}: ` +
          `start the server with --allowed-origin ${location.origin}, or open the page the server serves.`;
      }
    }
    const choice = $("transport").value;
    const transport = choice === "auto" ? (config.webrtc ? "webrtc" : "websocket") : choice;
    const mic = await microphone();
    session = new Session(mic, new AudioContext());
    try {
      await session.start(transport);
    } catch (error) {
      throw refusedOrigin === null ? error : new Error(`${refusedOrigin} (${error.message})`);
    }
  } catch (error) {
    const failed = session;
    session = null;
    failed?.close();
    showError(error.message);
    setState("FAILED");
  }
}

function stop() {
  const closing = session;
  session = null;
  closing?.close();
  setState("IDLE");
}

$("talk").addEventListener("click", () => (session ? stop() : start()));
$("commit").addEventListener("click", () => {
  if (!session) return;
  session.send({ type: "input_audio_buffer.commit" });
  session.send({ type: "response.create" });
  session.turnEnd = session.lastVoice ?? performance.now();
  setState("THINKING");
});
$("typed").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("message").value.trim();
  if (!text || !session) return;
  $("message").value = "";
  session.typed(text);
  setState("THINKING");
});
for (const id of ["voice", "turns"]) {
  $(id).addEventListener("change", () => {
    if (!session) return;
    session.send(sessionUpdate());
    setState(stats.state); // the manual-turn button follows the setting
  });
}
loadConfig().catch(() => {}); // a cross-origin page without CORS learns why when it connects
setState("IDLE");
