"""The Hugging Face Hub: find models by name, download one into the Hugging Face cache, keep the user's token, push
an export.

    search.py      search_models(text, limit) -> [HubModel]; model_files(repo_id) -> HubFiles (sizes, commit)
    download.py    download_model(repo_id, revision, progress, stop): resumable, stoppable, byte-checked
    push.py        push_folder(folder, repo_id, private, progress, stop): an export and its model card in one commit
    token.py       the access token in the OS keyring (never in a run config), or HF_TOKEN / `hf auth login`
    connection.py  the endpoint (HF_ENDPOINT at call time), the cache folder, and the Hub's errors in words
    fit.py         fits_this_machine(repo_id, config): the memory planner's answer from the model's config.json

Importing a module here loads huggingface_hub at most (no torch, no Qt); fit.py loads transformers when called.
"""

__all__: list[str] = []
