"""The one exception a user must act on: a message and a hint, printed as two lines by the CLI."""


class ForgeError(Exception):
    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message
