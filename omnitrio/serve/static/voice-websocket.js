import { PREBUFFER_S, RATE, server, stats } from "./voice-shared.js";

// -- the WebSocket: audio in the events, played by the jitter buffer ---------------------------

export class WebSocketTransport {
  constructor(session, key) {
    this.session = session;
    this.key = key;
    this.truncated = new Set();
  }

  open() {
    const url = new URL("/v1/realtime", server);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    const protocols = ["realtime", ...(this.key ? [`openai-insecure-api-key.${this.key}`] : [])];
    const ws = (this.ws = new WebSocket(url, protocols));
    const ctx = this.session.audio;
    this.player = new AudioWorkletNode(ctx, "playback", {
      processorOptions: { rate: RATE, prebuffer: PREBUFFER_S },
      outputChannelCount: [1],
    });
    this.player.connect(ctx.destination);
    this.player.port.onmessage = (event) => this.fromPlayer(event.data);
    return new Promise((resolve, reject) => {
      ws.onopen = () => {
        ws.opened = true;
        resolve();
      };
      ws.onmessage = (event) => this.session.receive(JSON.parse(event.data));
      ws.onclose = (event) => {
        const reason = event.reason ? `: ${event.reason}` : "";
        if (ws.opened) this.session.closed(`The server closed the connection (close ${event.code}${reason}).`);
        else reject(new Error(`The server refused the WebSocket connection to ${url.origin} (close ${event.code}${reason}).`));
      };
    });
  }

  send(event) {
    if (this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(event));
  }

  microphone(pcm) {
    const bytes = new Uint8Array(pcm);
    let binary = "";
    for (let i = 0; i < bytes.length; i += 0x2000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x2000));
    this.send({ type: "input_audio_buffer.append", audio: btoa(binary) });
  }

  play(event) {
    if (this.truncated.has(event.item_id)) {
      stats.dropped[event.item_id] = (stats.dropped[event.item_id] || 0) + 1;
      return;
    }
    const binary = atob(event.delta);
    const pcm = new Int16Array(binary.length / 2);
    const view = new DataView(pcm.buffer);
    for (let i = 0; i < binary.length; i++) view.setUint8(i, binary.charCodeAt(i));
    this.player.port.postMessage({ type: "push", item: event.item_id, pcm: pcm.buffer }, [pcm.buffer]);
  }

  ended(itemId) {
    this.player.port.postMessage({ type: "end", item: itemId });
  }

  interrupt(itemId) {
    this.truncated.add(itemId);
    this.player.port.postMessage({ type: "clear" });
  }

  fromPlayer(message) {
    switch (message.type) {
      case "started":
        this.session.started(message.item);
        break;
      case "played":
        stats.played[message.item] = message.samples;
        break;
      case "finished":
        this.session.stopped();
        break;
      case "cleared": {
        if (message.item === null) break;
        stats.played[message.item] = message.samples;
        const ms = Math.floor((message.samples * 1000) / RATE);
        this.send({ type: "conversation.item.truncate", item_id: message.item, content_index: 0, audio_end_ms: ms });
        this.session.stopped();
        break;
      }
    }
  }

  close() {
    this.ws.onclose = null;
    this.ws.close();
  }
}
