"""Recognisable fake store credentials for the reliability tests. The S3 test server accepts any; the secret
test searches every output for these strings."""

FAKE_KEY = "AKIDBATONRELIABLE001"
FAKE_SECRET = "batonFakeSecret-7f3a9c-NEVER-PRINT-ME"
FAKE_HF_TOKEN = "hf_batonFakeToken7f3a9cNeverPrint"
SECRETS = (FAKE_KEY, FAKE_SECRET, FAKE_HF_TOKEN)
