"""What the tests share: configs, test servers, the zygote, the chaos harness."""
