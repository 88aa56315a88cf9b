// Anchor translation unit for the LibTorch precompiled header that
// executables (-fPIE) reuse; see e3_use_torch_pch in E3Helpers.cmake.
int main() { return 0; }
