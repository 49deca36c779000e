"""Test peers shipped beside forgeflow: the Gitea emulator (and later the scripted model)."""
