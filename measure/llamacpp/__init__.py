"""llama.cpp held to the real engine on a CPU: KV-faithful miniature GGUFs (gguf_writer), loads of them through
llama-cpp-python (run), the memory lines llama.cpp prints (logparse) and the report that keeps them (report)."""
