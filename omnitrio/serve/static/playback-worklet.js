// A jitter buffer for the assistant's audio that says what was actually played.
//
// Messages in: {type: "push", item, pcm: Int16Array at `rate`}, {type: "end", item} (no more audio
// for it), {type: "clear"}. Messages out: {type: "started", item}, {type: "played", item, samples}
// (every ~100 ms while playing, and when an item ends), {type: "finished", item} (all of an ended
// item has played), {type: "cleared", item, samples}: `samples`
// counts the item's samples (at `rate`) that reached the speakers. Playback of an item starts once
// `prebuffer` seconds are queued or the item has ended, and waits the same way after an underrun.
class Playback extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.rate = options.processorOptions.rate;
    this.prebuffer = Math.round(options.processorOptions.prebuffer * this.rate);
    this.step = this.rate / sampleRate; // source samples per output sample
    this.queue = []; // [{item, pcm: Float32Array}]
    this.queued = 0;
    this.ended = new Set();
    this.playing = false;
    this.item = null;
    this.samples = 0; // of this.item, played
    this.pos = 0; // fractional read position in queue[0]
    this.sinceReport = 0;
    this.port.onmessage = (event) => this.command(event.data);
  }

  command(message) {
    switch (message.type) {
      case "push": {
        const pcm = new Int16Array(message.pcm);
        const f = new Float32Array(pcm.length);
        for (let i = 0; i < pcm.length; i++) f[i] = pcm[i] / 0x8000;
        this.queue.push({ item: message.item, pcm: f });
        this.queued += f.length;
        break;
      }
      case "end":
        this.ended.add(message.item);
        break;
      case "clear":
        this.port.postMessage({ type: "cleared", item: this.item, samples: Math.floor(this.samples) });
        this.queue = [];
        this.queued = 0;
        this.playing = false;
        this.pos = 0;
        this.item = null;
        break;
    }
  }

  report() {
    this.port.postMessage({ type: "played", item: this.item, samples: Math.floor(this.samples) });
    this.sinceReport = 0;
  }

  process(inputs, outputs) {
    const out = outputs[0][0];
    if (!this.playing && this.queue.length) {
      const item = this.queue[0].item;
      this.playing = this.queued >= this.prebuffer || this.ended.has(item);
    }
    for (let n = 0; n < out.length; n++) {
      if (!this.playing || !this.queue.length) {
        out[n] = 0;
        continue;
      }
      const head = this.queue[0];
      if (head.item !== this.item) {
        if (this.item !== null) this.report();
        this.item = head.item;
        this.samples = 0;
        this.port.postMessage({ type: "started", item: head.item });
      }
      const i = Math.floor(this.pos);
      const a = head.pcm[i];
      const b = i + 1 < head.pcm.length ? head.pcm[i + 1] : a;
      out[n] = a + (b - a) * (this.pos - i);
      this.pos += this.step;
      this.samples += this.step;
      if (this.pos >= head.pcm.length) {
        this.pos -= head.pcm.length;
        this.queued -= head.pcm.length;
        this.queue.shift();
        if (!this.queue.length) {
          this.pos = 0;
          this.playing = false; // underrun, or the item's end: wait for the prebuffer again
          if (this.ended.has(this.item)) {
            this.report();
            this.port.postMessage({ type: "finished", item: this.item });
          }
        }
      }
    }
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out);
    this.sinceReport += out.length;
    if (this.playing && this.sinceReport >= sampleRate / 10) this.report();
    return true;
  }
}

registerProcessor("playback", Playback);
