// The microphone, resampled to the session's rate (PCM16 mono) and posted in 20 ms pieces.
// Each piece carries its level, so the page can tell when the user last spoke.
class Capture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.outRate = options.processorOptions.rate;
    this.step = sampleRate / this.outRate; // input samples per output sample
    this.pos = 0; // position of the next output sample, in input samples from the start of `prev`
    this.prev = 0; // the last input sample of the previous block
    this.piece = new Int16Array(this.outRate / 50);
    this.filled = 0;
    this.peak = 0;
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return true;
    // Linear interpolation between input samples; `pos` -1..0 falls between `prev` and channel[0].
    while (this.pos < channel.length - 1) {
      const i = Math.floor(this.pos);
      const frac = this.pos - i;
      const a = i < 0 ? this.prev : channel[i];
      const b = channel[i + 1];
      const x = Math.max(-1, Math.min(1, a + (b - a) * frac));
      this.peak = Math.max(this.peak, Math.abs(x));
      this.piece[this.filled++] = x < 0 ? x * 0x8000 : x * 0x7fff;
      if (this.filled === this.piece.length) {
        this.port.postMessage({ pcm: this.piece.buffer, peak: this.peak, time: currentTime }, [this.piece.buffer]);
        this.piece = new Int16Array(this.outRate / 50);
        this.filled = 0;
        this.peak = 0;
      }
      this.pos += this.step;
    }
    this.prev = channel[channel.length - 1];
    this.pos -= channel.length;
    return true;
  }
}

registerProcessor("capture", Capture);
