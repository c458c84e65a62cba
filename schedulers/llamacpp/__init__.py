"""The CPU language-model engine on llama.cpp (llama-cpp-python's low-level API): our batching loop."""
