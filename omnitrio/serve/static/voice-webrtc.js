import { PLAYED_LEVEL, errorMessage, server, stats } from "./voice-shared.js";

// -- WebRTC: Opus tracks both ways, the events on the "oai-events" data channel ------------------

export class WebRTCTransport {
  constructor(session, key) {
    this.session = session;
    this.key = key;
    this.assistantAudio = false;
  }

  async open() {
    const pc = (this.pc = new RTCPeerConnection());
    this.session.mic.getAudioTracks().forEach((track) => pc.addTrack(track, this.session.mic));
    this.element = new Audio();
    this.element.autoplay = true;
    pc.ontrack = (event) => {
      this.element.srcObject = event.streams[0];
      const ctx = this.session.audio;
      const meter = new AudioWorkletNode(ctx, "meter");
      ctx.createMediaStreamSource(event.streams[0]).connect(meter);
      meter.port.onmessage = (e) => {
        if (e.data.peak < PLAYED_LEVEL) return;
        if (this.assistantAudio) this.session.firstAudio();
        else if (stats.cutAt !== null) stats.loudAfterCut.push(Math.round(performance.now() - stats.cutAt));
      };
    };
    const channel = (this.channel = pc.createDataChannel("oai-events"));
    const opened = new Promise((resolve, reject) => {
      channel.onopen = () => resolve();
      channel.onclose = () => this.session.closed("The WebRTC connection closed.");
      pc.onconnectionstatechange = () => {
        if (pc.connectionState === "failed") reject(new Error("The WebRTC connection failed (no ICE route to the server)."));
      };
    });
    channel.onmessage = (event) => this.receive(JSON.parse(event.data));
    await pc.setLocalDescription(await pc.createOffer());
    const headers = { "Content-Type": "application/sdp" };
    if (this.key) headers.Authorization = `Bearer ${this.key}`;
    const response = await fetch(new URL("/v1/realtime/calls", server), {
      method: "POST",
      headers,
      body: pc.localDescription.sdp,
    });
    if (!response.ok) throw new Error(`The server refused the call: ${await errorMessage(response)}`);
    await pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
    await opened;
  }

  receive(event) {
    switch (event.type) {
      case "output_audio_buffer.started":
        this.assistantAudio = true;
        stats.cutAt = null;
        stats.started.push(event.response_id);
        this.session.started(event.item_id ?? event.response_id);
        this.item = event.item_id;
        break;
      case "output_audio_buffer.cleared":
        stats.cutAt = performance.now();
        stats.cut.push(event.response_id);
      // falls through
      case "output_audio_buffer.stopped":
        this.assistantAudio = false;
        this.session.stopped();
        break;
    }
    this.session.receive(event);
  }

  send(event) {
    if (this.channel.readyState === "open") this.channel.send(JSON.stringify(event));
  }

  microphone() {} // the microphone goes as the audio track

  play() {} // the answer comes as the audio track

  ended() {}

  interrupt() {
    this.send({ type: "output_audio_buffer.clear" });
  }

  close() {
    this.channel.onclose = null;
    this.pc.close();
  }
}
