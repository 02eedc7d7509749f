"""Recognisable fake store credentials for the reliability tests. The S3 test server accepts any; the secret
test searches every output for these strings."""

FAKE_KEY = "AKIDBATONRELIABLE001"
FAKE_SECRET = "batonFakeSecret-7f3a9c-NEVER-PRINT-ME"
FAKE_HF_TOKEN = "hf_batonFakeToken7f3a9cNeverPrint"
# Tracker credentials: W&B's API key, MLflow's password and token (offline W&B and a file store need none,
# so a leak here could only be the tracker code writing out its environment).
FAKE_WANDB_KEY = "b4t0nfake7f3a9c0000wandbkeyneverprint00"
FAKE_MLFLOW_PASSWORD = "batonFakeMlflowPassword-7f3a9c"
FAKE_MLFLOW_TOKEN = "batonFakeMlflowToken-7f3a9c"
SECRETS = (FAKE_KEY, FAKE_SECRET, FAKE_HF_TOKEN, FAKE_WANDB_KEY, FAKE_MLFLOW_PASSWORD, FAKE_MLFLOW_TOKEN)
