# Included into llama.cpp's own project() by the README's CMAKE_ARGS (CMAKE_PROJECT_llama.cpp_INCLUDE) when
# pip builds llama-cpp-python: omnitrio loads only libllama and libggml through the Python bindings, so the
# "common" helper library (chat parsers, jinja, an HTTP client), which llama-cpp-python forces on, is not built.
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)
