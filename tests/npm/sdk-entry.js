// Test-only: OpenAI's browser SDK against omnitrio, bundled by esbuild for tests/test_voice_page_sdk.py.
// window.runSdk({transport, key, origin, withTool}) connects one RealtimeSession; window.sdkLog is what it saw.
import { RealtimeAgent, RealtimeSession, tool } from "@openai/agents-realtime";

const RATE = 24000;

const weather = tool({
  name: "get_weather",
  description: "The weather in a city.",
  parameters: {
    type: "object",
    properties: { city: { type: "string" } },
    required: ["city"],
    additionalProperties: false,
  },
  strict: true,
  execute: async ({ city }) => {
    window.sdkLog.toolCalls.push(city);
    return `It is sunny in ${city}.`;
  },
});

// Over the WebSocket the SDK leaves the microphone to the app: the page's own capture worklet feeds it.
async function microphoneInto(session) {
  const mic = await navigator.mediaDevices.getUserMedia({
    audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true },
  });
  const ctx = new AudioContext();
  await ctx.audioWorklet.addModule("/static/capture-worklet.js");
  const capture = new AudioWorkletNode(ctx, "capture", { processorOptions: { rate: RATE } });
  ctx.createMediaStreamSource(mic).connect(capture);
  capture.port.onmessage = (event) => session.sendAudio(event.data.pcm);
}

window.runSdk = async ({ transport, key, origin, withTool }) => {
  const log = (window.sdkLog = { events: [], history: [], toolCalls: [], audio: 0, errors: [], connected: false });
  const agent = new RealtimeAgent({ name: "assistant", instructions: "Answer briefly.", tools: withTool ? [weather] : [] });
  const url = transport === "webrtc" ? `${origin}/v1/realtime/calls` : `${origin.replace(/^http/, "ws")}/v1/realtime`;
  const session = new RealtimeSession(agent, {
    transport,
    model: "gpt-realtime",
    config: { audio: { input: { transcription: { model: "whisper-1" } } } },
  });
  session.on("transport_event", (event) => log.events.push(event.type));
  session.on("history_updated", (history) => (log.history = JSON.parse(JSON.stringify(history))));
  session.on("audio", () => log.audio++);
  session.on("error", (event) => log.errors.push(String(event.error?.message ?? JSON.stringify(event.error))));
  await session.connect({ apiKey: key, url });
  log.connected = true;
  if (transport === "websocket") await microphoneInto(session);
  window.sdkSession = session;
};
