"""The engine layer, written once: what every stepping scheduler of every model family uses.

* :mod:`.step_loop`: the scheduler thread's loop (block while idle, take every queued message in
  order, step, one outbox wake-up per turn);
* :mod:`.intake`: how a scheduler of whole requests reads new requests, aborts and refused stream input;
* :mod:`.admission`: the checks before a request is queued (prompt, context, answer budget, queue room)
  with OpenAI's error codes;
* :mod:`.kv_batch`: the keys/values of many requests in one batch that grows in place and steps any
  subset of its rows, seen by transformers' models as a ``Cache``;
* :mod:`.sampling`: how a decoder picks its next token, as ``generate`` does (greedy, or seeded sampling);
* :mod:`.decoder`: continuous batching of a decoder over the KV batch, for any family's model wrapper;
* :mod:`.decoder_stage`: that decoder as a stage, a family's hook reading requests and building handoffs;
* :mod:`.text_decode`: the terminal text decode stage over a family's token and result handoffs;
* :mod:`.stream_fed`: a stage fed by another stage's stream (a talker speaking while the thinker
  writes): the request lifecycle, batching and abort, with a family's model and text as hooks.

Importing the package loads nothing: import the module you use.
"""
