"""A module the registry test imports only halfway through (for ``register_patch(..., loaded_only=True)``)."""


class Tower:
    def forward(self, x):
        return x
