// What the voice page's modules share: the session's audio rate, the server, and what the page measured.
//
// stats is window.voiceStats: latencies, played samples per item, truncations, the server's event
// types but the deltas; read by the tests and the benchmark.

export const RATE = 24000;
export const PREBUFFER_S = 0.08;
export const PLAYED_LEVEL = 0.005; // remote audio this loud is the answer playing (WebRTC)

const params = new URLSearchParams(location.search);
export const server = new URL(params.get("server") || location.origin);

export const stats = (window.voiceStats = {
  state: "IDLE",
  transport: null,
  events: [],
  latencies: [],
  played: {},
  truncated: {},
  dropped: {},
  cutAt: null, // WebRTC: when the server last cut the answer short
  loudAfterCut: [], // WebRTC: ms after that cut at which answer audio was still heard
  started: [], // WebRTC: the responses whose audio started playing, in order (output_audio_buffer.started)
  cut: [], // WebRTC: the responses cut short (output_audio_buffer.cleared)
  errors: [],
});

export async function errorMessage(response) {
  try {
    const body = await response.json();
    return body.error.message;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}
