// The level of a stream (the assistant's audio over WebRTC), posted every 20 ms.
class Meter extends AudioWorkletProcessor {
  constructor() {
    super();
    this.peak = 0;
    this.count = 0;
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (channel) {
      for (let i = 0; i < channel.length; i++) this.peak = Math.max(this.peak, Math.abs(channel[i]));
      this.count += channel.length;
    }
    if (this.count >= sampleRate / 50) {
      this.port.postMessage({ peak: this.peak });
      this.peak = 0;
      this.count = 0;
    }
    return true;
  }
}

registerProcessor("meter", Meter);
